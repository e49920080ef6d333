//! Helpers shared by integration tests (`mod support;` in a test file): what the tests
//! install and start for themselves.
// Each test binary uses a part of them.
#![allow(dead_code)]

pub(crate) mod chromium;
pub(crate) mod seaweed;
