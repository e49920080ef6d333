//! Helpers shared by integration tests (`mod support;` in a test binary of its own,
//! `use crate::support;` in a module of `tests/it`): what the tests install and start for
//! themselves.
// Each test binary uses a part of them.
#![allow(dead_code)]

pub(crate) mod chromium;
pub(crate) mod seaweed;
