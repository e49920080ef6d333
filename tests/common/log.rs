//! Logs of a test or bench, and of the worker processes it starts, when asked for.
#![allow(unreachable_pub)]

/// Logs to standard error at the level the variable `var` names (`debug`, `info`, ...), if
/// it is set, and says who logs (worker processes inherit the variable).
pub fn log_if_asked(var: &str, who: &'static str) {
    let Some(level) = std::env::var(var)
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
    else {
        return;
    };
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .finish();
    let _ = tracing::subscriber::set_global_default(subscriber);
    tracing::info!(who, pid = std::process::id(), "logging");
}
