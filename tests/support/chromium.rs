//! Headless Chromium for tests that render a page: Debian's `chromium`, installed by the test
//! itself when the machine has none, so that the README's test command alone passes on a
//! fresh machine (as `seaweed.rs` provisions its S3 server and `tests/slurm/provision.sh`
//! its Slurm).
//!
//! # Provisioning
//!
//! 1. A browser that answers `--version` (`chromium`, or `chromium-browser` on distributions
//!    that name it so) is used as it is.
//! 2. Otherwise [`INSTALL`] runs, as root, under an exclusive `flock` on [`LOCK`], a file
//!    shared by every test process of the machine: test binaries that start at the same time
//!    install it once. Under the lock it looks again (another process may have installed it
//!    while this one waited), then runs `apt-get update` once and
//!    `DEBIAN_FRONTEND=noninteractive apt-get install -y chromium`. Each apt command waits
//!    for apt's own lock (another test may be installing Slurm) and is tried again a few
//!    times, in case a mirror answered badly.
//! 3. The browser must then answer `--version`.
//!
//! If any step fails, [`chromium`] panics with the reason and apt's output: a test that needs
//! a browser fails, it is never skipped.

use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The lock file that serializes installs between test processes (as `/run` is a tmpfs, a
/// lock left by a reboot cannot linger).
pub(crate) const LOCK: &str = "/run/malleable-chromium-provision.lock";

/// The browser's commands, in the order they are tried.
const NAMES: [&str; 2] = ["chromium", "chromium-browser"];

/// The install, run by bash as root with the lock file as `$1`.
pub(crate) const INSTALL: &str = r#"
set -euo pipefail
exec 9>"$1"
flock 9
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  echo "chromium: installed by another test process"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# Another test may hold apt's lock (tests/slurm/provision.sh installs Slurm): wait for it.
apt=(apt-get -o DPkg::Lock::Timeout=600)
retry() {
  for attempt in 1 2 3; do
    "$@" && return 0
    echo "chromium: '$*' failed (attempt $attempt of 3)" >&2
    sleep 5
  done
  return 1
}
echo "chromium: installing Debian's chromium"
retry "${apt[@]}" update
retry "${apt[@]}" install -y chromium
"#;

/// The command that starts the browser, installing it first if the machine has none (see
/// the module docs). Provisioned once per test process.
///
/// # Panics
///
/// If no browser is installed and it cannot be installed, with the reason: the calling test
/// fails.
pub(crate) fn chromium() -> &'static str {
    static BROWSER: OnceLock<Result<&'static str, String>> = OnceLock::new();
    match BROWSER.get_or_init(provision) {
        Ok(name) => name,
        Err(reason) => panic!("could not provision headless Chromium for this test: {reason}"),
    }
}

/// The first of [`NAMES`] that answers `--version`.
fn installed() -> Option<&'static str> {
    NAMES.into_iter().find(|name| {
        Command::new(name)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn provision() -> Result<&'static str, String> {
    if let Some(name) = installed() {
        return Ok(name);
    }
    if !is_root() {
        return Err(
            "no `chromium` on this machine, and the test installs it only as root \
             (with apt-get): run the tests as root, or install it \
             (Debian: apt-get install -y chromium)"
                .to_owned(),
        );
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(INSTALL)
        .arg("install-chromium")
        .arg(LOCK)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run bash to install chromium: {e}"))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!(
            "installing Debian's chromium failed ({}); the end of its output:\n{}",
            out.status,
            tail(&log)
        ));
    }
    installed().ok_or_else(|| {
        format!(
            "chromium was installed but neither of {NAMES:?} answers --version; the end of \
             the install's output:\n{}",
            tail(&log)
        )
    })
}

/// Whether this process runs as root (`id -u` prints 0).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The last 40 lines of a log.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
