//! Helpers shared by integration tests (`mod support;` in a test file).

pub(crate) mod seaweed;
