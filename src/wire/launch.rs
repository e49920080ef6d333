//! Launchers: how worker processes are started.
//!
//! A [`Launcher`] starts one worker process per call, told by a [`LaunchSpec`] which
//! coordinator address to dial and which number the worker has among those its job launched.
//! It returns a [`Launched`] handle the job uses to log, watch and, if need be, kill it.
//!
//! - [`CommandLauncher`] runs a command built from a template such as
//!   `ssh {host} {bin} --worker {addr}`, `srun --ntasks=1 --exact {bin} --worker {addr}` or
//!   `kubectl run ... -- {bin} --worker {addr}`. The template is split into words like a POSIX
//!   shell would (quotes and backslashes, no expansion), then the placeholders `{addr}`,
//!   `{host}`, `{bin}` and `{index}` are replaced inside each word.
//! - [`LocalLauncher`] runs a program on this machine, with arguments that may hold `{addr}`
//!   and `{index}`.
//!
//! Braces that do not spell one of these placeholders are left as they are, so JSON in a
//! `kubectl --overrides='{"spec": ...}'` or a shell's `${VAR}` pass through.
//!
//! # The token
//!
//! The shared token goes to the child in the environment variable [`TOKEN_ENV`], never on its
//! command line, which any user of the machine can read with `ps`. The spec decides: with a
//! token, the variable is set to it (over any value from [`CommandLauncher::env`] or
//! [`LocalLauncher::env`]); without one, the value this process inherited is not passed on
//! (a worker holding a token its coordinator does not use fails the handshake), though an
//! explicit `env` still applies. [`Launched::describe`] shows the command line only, so logs
//! never hold the token.
//!
//! The environment reaches the process this side starts, not necessarily the worker behind it:
//!
//! - `srun` passes its whole environment to the task by default (`--export=ALL`).
//!   Inside an allocation, give it `--exact`
//!   ([`slurm::SRUN_LAUNCH`](crate::slurm::SRUN_LAUNCH)): without it each job step takes
//!   every CPU of the allocation, and the second worker waits until the first one ends.
//! - `ssh` passes it only when asked: `ssh -o SendEnv=MALLEABLE_TOKEN {host} ...`, with
//!   `AcceptEnv MALLEABLE_TOKEN` in the remote `sshd_config`. Note that ssh joins the remote
//!   words into one shell command line, so a `{bin}` path with spaces needs quoting there.
//! - `kubectl run` passes none of it: mount the token from a Secret into the pod instead.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};

use super::{Error, TOKEN_ENV, Token};

/// Starts worker processes for a job's coordinator.
pub trait Launcher: Send + Sync + fmt::Debug {
    /// Starts one worker process that dials `spec.addr`.
    ///
    /// # Errors
    ///
    /// The error from building the command (for example [`io::ErrorKind::InvalidInput`] for a
    /// template that uses `{host}` when no hosts were given) or from spawning the process.
    fn launch(&self, spec: &LaunchSpec) -> io::Result<Box<dyn Launched>>;
}

/// What a launcher needs to start one worker.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The coordinator's address the worker dials.
    pub addr: SocketAddr,
    /// The worker's number among those this job launched (0, 1, 2, ...).
    pub index: usize,
    /// The shared token, passed to the child in the environment variable [`TOKEN_ENV`], never
    /// on its command line. `None` when the coordinator uses none.
    pub token: Option<Token>,
}

/// A started worker process.
pub trait Launched: Send + fmt::Debug {
    /// A description for logs (the command line, no secrets).
    fn describe(&self) -> String;

    /// Its exit status if it has exited (non-blocking).
    ///
    /// # Errors
    ///
    /// The operating system's error from checking on the process.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>>;

    /// Kills it (SIGKILL) and reaps it. A process that has already exited is only reaped.
    ///
    /// # Errors
    ///
    /// The operating system's error from killing or waiting for the process.
    fn kill(&mut self) -> io::Result<()>;
}

/// Starts each worker with a command built from a template, such as
/// `ssh {host} {bin} --worker {addr}` or `srun --ntasks=1 --exact {bin} --worker {addr}`.
///
/// The template is split into words once, by [`CommandLauncher::new`]; the first word is the
/// program. At each launch these placeholders are replaced inside every word:
///
/// | placeholder | value |
/// |---|---|
/// | `{addr}` | the coordinator's address, [`LaunchSpec::addr`] (listening on `0.0.0.0`, this is `0.0.0.0:port`, which only a worker on the same host can dial: listen on an address the workers reach, such as the node's name) |
/// | `{index}` | the worker's number, [`LaunchSpec::index`] |
/// | `{host}` | host number `index % hosts` of [`CommandLauncher::hosts`] |
/// | `{bin}` | [`CommandLauncher::bin`], by default this process's own executable |
///
/// The child's standard input is null; its output and errors go to this process's.
///
/// ```no_run
/// use malleable::cluster::{CommandLauncher, LaunchSpec, Launcher};
///
/// let template = "ssh -o SendEnv=MALLEABLE_TOKEN {host} {bin} --worker {addr}";
/// let launcher = CommandLauncher::new(template)?
///     .hosts(["node1", "node2"])
///     .bin("/opt/app/worker");
/// let spec = LaunchSpec { addr: "10.0.0.1:7000".parse()?, index: 0, token: None };
/// let worker = launcher.launch(&spec)?; // ssh node1 /opt/app/worker --worker 10.0.0.1:7000
/// println!("started {}", worker.describe());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct CommandLauncher {
    /// The template as given, for errors.
    template: String,
    /// The template's words, placeholders not yet replaced; never empty.
    words: Vec<String>,
    /// What `{host}` cycles through.
    hosts: Vec<String>,
    /// What `{bin}` stands for; `None` for this process's executable, looked up at launch.
    bin: Option<PathBuf>,
    /// Extra environment for the child.
    envs: Vec<(OsString, OsString)>,
}

impl CommandLauncher {
    /// A launcher that runs `template`, split into words like a POSIX shell would (single and
    /// double quotes, backslashes; no variable or glob expansion).
    ///
    /// # Errors
    ///
    /// [`Error::Address`] naming the template, with an [`io::ErrorKind::InvalidInput`] source,
    /// if the template holds no word or its quoting is unbalanced.
    pub fn new(template: &str) -> Result<CommandLauncher, Error> {
        let invalid = |why: String| Error::Address {
            addr: template.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, why),
        };
        let words = shell_words::split(template)
            .map_err(|e| invalid(format!("the launch command does not parse: {e}")))?;
        if words.is_empty() {
            return Err(invalid("the launch command is empty".to_owned()));
        }
        Ok(CommandLauncher {
            template: template.to_owned(),
            words,
            hosts: Vec::new(),
            bin: None,
            envs: Vec::new(),
        })
    }

    /// The hosts `{host}` stands for: worker `index` gets host `index % hosts.len()`. Replaces
    /// any hosts given before.
    pub fn hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.hosts = hosts.into_iter().map(Into::into).collect();
        self
    }

    /// The path `{bin}` stands for (by default [`std::env::current_exe`], which suits hosts
    /// that see this executable at the same path).
    pub fn bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.bin = Some(path.into());
        self
    }

    /// Sets an extra environment variable for the launched command.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// The command line for `spec`, placeholders replaced; the program first.
    fn argv(&self, spec: &LaunchSpec) -> io::Result<Vec<OsString>> {
        let addr = spec.addr.to_string();
        let index = spec.index.to_string();
        // Looked up once, and only if the template uses `{bin}`.
        let mut bin: Option<OsString> = None;
        let mut argv = Vec::with_capacity(self.words.len());
        for word in &self.words {
            argv.push(substitute(word, |name| {
                Ok(Some(match name {
                    "addr" => OsString::from(&addr),
                    "index" => OsString::from(&index),
                    "host" => OsString::from(self.host(spec.index)?),
                    "bin" => match &bin {
                        Some(b) => b.clone(),
                        None => bin.insert(self.bin_path()?).clone(),
                    },
                    _ => return Ok(None),
                }))
            })?);
        }
        Ok(argv)
    }

    /// The host of worker `index`.
    fn host(&self, index: usize) -> io::Result<&str> {
        if self.hosts.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the launch command `{}` uses {{host}} but no hosts were given",
                    self.template
                ),
            ));
        }
        Ok(&self.hosts[index % self.hosts.len()])
    }

    /// What `{bin}` stands for.
    fn bin_path(&self) -> io::Result<OsString> {
        match &self.bin {
            Some(path) => Ok(path.clone().into_os_string()),
            None => std::env::current_exe().map(PathBuf::into_os_string),
        }
    }
}

impl fmt::Debug for CommandLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Environment values may be secrets: show the keys only.
        f.debug_struct("CommandLauncher")
            .field("template", &self.template)
            .field("hosts", &self.hosts)
            .field("bin", &self.bin)
            .field("env", &EnvKeys(&self.envs))
            .finish()
    }
}

impl Launcher for CommandLauncher {
    fn launch(&self, spec: &LaunchSpec) -> io::Result<Box<dyn Launched>> {
        spawn(self.argv(spec)?, &self.envs, spec.token.as_ref())
    }
}

/// Starts each worker as a process on this machine: a program and its arguments, in which
/// `{addr}` and `{index}` are replaced as for [`CommandLauncher`] (arguments that are not
/// UTF-8 pass unchanged).
///
/// The child's standard input is null; its output and errors go to this process's.
///
/// ```no_run
/// use malleable::cluster::{LaunchSpec, Launcher, LocalLauncher};
///
/// let launcher = LocalLauncher::current_exe()?.args(["--worker", "{addr}"]);
/// let spec = LaunchSpec { addr: "127.0.0.1:7000".parse()?, index: 0, token: None };
/// let worker = launcher.launch(&spec)?;
/// println!("started {}", worker.describe());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct LocalLauncher {
    /// The program to run.
    program: PathBuf,
    /// Its arguments, placeholders not yet replaced.
    args: Vec<OsString>,
    /// Extra environment for the child.
    envs: Vec<(OsString, OsString)>,
}

impl LocalLauncher {
    /// A launcher that runs `program`, with no arguments yet.
    pub fn new(program: impl Into<PathBuf>) -> LocalLauncher {
        LocalLauncher {
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
        }
    }

    /// A launcher that runs this process's own executable, with no arguments yet.
    ///
    /// # Errors
    ///
    /// The error of [`std::env::current_exe`].
    pub fn current_exe() -> io::Result<LocalLauncher> {
        std::env::current_exe().map(LocalLauncher::new)
    }

    /// Adds an argument, which may hold `{addr}` and `{index}`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments, which may hold `{addr}` and `{index}`.
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an extra environment variable for the program.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// The command line for `spec`, placeholders replaced; the program first.
    fn argv(&self, spec: &LaunchSpec) -> io::Result<Vec<OsString>> {
        let addr = spec.addr.to_string();
        let index = spec.index.to_string();
        let mut argv = Vec::with_capacity(1 + self.args.len());
        argv.push(self.program.clone().into_os_string());
        for arg in &self.args {
            let Some(arg) = arg.to_str() else {
                argv.push(arg.clone());
                continue;
            };
            argv.push(substitute(arg, |name| {
                Ok(match name {
                    "addr" => Some(OsString::from(&addr)),
                    "index" => Some(OsString::from(&index)),
                    _ => None,
                })
            })?);
        }
        Ok(argv)
    }
}

impl fmt::Debug for LocalLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Environment values may be secrets: show the keys only.
        f.debug_struct("LocalLauncher")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &EnvKeys(&self.envs))
            .finish()
    }
}

impl Launcher for LocalLauncher {
    fn launch(&self, spec: &LaunchSpec) -> io::Result<Box<dyn Launched>> {
        spawn(self.argv(spec)?, &self.envs, spec.token.as_ref())
    }
}

/// Debug-prints the keys of an environment, not its values.
struct EnvKeys<'a>(&'a [(OsString, OsString)]);

impl fmt::Debug for EnvKeys<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
}

/// Replaces each `{name}` in `word` for which `value(name)` gives a value; other braces stay
/// as they are.
fn substitute(
    word: &str,
    mut value: impl FnMut(&str) -> io::Result<Option<OsString>>,
) -> io::Result<OsString> {
    let mut out = OsString::with_capacity(word.len());
    let mut rest = word;
    while let Some(open) = rest.find('{') {
        out.push(&rest[..open]);
        let after = &rest[open + 1..];
        let replaced = match after.find('}') {
            Some(close) => value(&after[..close])?.map(|v| (v, &after[close + 1..])),
            None => None,
        };
        match replaced {
            Some((v, tail)) => {
                out.push(v);
                rest = tail;
            }
            None => {
                // Not a placeholder: keep the brace, look for one after it (as in `{{addr}`).
                out.push("{");
                rest = after;
            }
        }
    }
    out.push(rest);
    Ok(out)
}

/// Spawns `argv` (the program first) with `envs` and the token rule of the module docs.
fn spawn(
    argv: Vec<OsString>,
    envs: &[(OsString, OsString)],
    token: Option<&Token>,
) -> io::Result<Box<dyn Launched>> {
    let Some((program, args)) = argv.split_first() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the launch command is empty",
        ));
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    if token.is_none() {
        // Not this process's token, inherited: the spec says the coordinator uses none.
        command.env_remove(TOKEN_ENV);
    }
    command.envs(envs.iter().map(|(k, v)| (k, v)));
    if let Some(token) = token {
        command.env(TOKEN_ENV, env_value(token.secret()));
    }
    let child = command.spawn()?;
    Ok(Box::new(ChildProcess {
        child,
        description: describe(&argv),
    }))
}

/// The token's bytes as an environment value.
#[cfg(unix)]
fn env_value(secret: &[u8]) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    OsString::from_vec(secret.to_vec())
}

/// The token's bytes as an environment value (elsewhere than Unix, a token that is not UTF-8
/// cannot be passed as it is).
#[cfg(not(unix))]
fn env_value(secret: &[u8]) -> OsString {
    OsString::from(String::from_utf8_lossy(secret).into_owned())
}

/// A command line for logs, quoted so it can be pasted into a shell.
fn describe(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| shell_words::quote(&a.to_string_lossy()).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A worker process started by [`spawn`].
#[derive(Debug)]
struct ChildProcess {
    /// The process.
    child: Child,
    /// Its command line.
    description: String,
}

impl Launched for ChildProcess {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    fn kill(&mut self) -> io::Result<()> {
        match self.child.kill() {
            Ok(()) => {}
            // Older standard libraries report a child already reaped this way.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
            Err(e) => return Err(e),
        }
        self.child.wait().map(drop)
    }
}

impl Drop for ChildProcess {
    /// Does not kill: a worker leaves by itself when its job ends. Reaps it if it has exited
    /// already; one still running is reaped by the system once this process exits.
    fn drop(&mut self) {
        let _ = self.child.try_wait();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn spec(index: usize) -> LaunchSpec {
        LaunchSpec {
            addr: "127.0.0.1:9".parse().unwrap(),
            index,
            token: None,
        }
    }

    fn strings(argv: Vec<OsString>) -> Vec<String> {
        argv.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    /// Polls until `launched` exits, for at most 10 s.
    fn wait(launched: &mut dyn Launched) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = launched.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit",
                launched.describe()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn template_placeholders_are_replaced_inside_words() {
        let launcher =
            CommandLauncher::new(r#"ssh {host} "{bin}" --worker {addr} --name=w{index} 'a b'"#)
                .unwrap()
                .hosts(["node1"])
                .bin("/opt/my app/worker");
        assert_eq!(
            strings(launcher.argv(&spec(3)).unwrap()),
            [
                "ssh",
                "node1",
                "/opt/my app/worker",
                "--worker",
                "127.0.0.1:9",
                "--name=w3",
                "a b",
            ]
        );
    }

    #[test]
    fn other_braces_are_kept() {
        let launcher = CommandLauncher::new(
            r#"kubectl run w --overrides='{"spec":{"x":1}}' -- sh -c '${HOME}/w {{addr} {addr' {bin}"#,
        )
        .unwrap()
        .bin("/w");
        assert_eq!(
            strings(launcher.argv(&spec(0)).unwrap()),
            [
                "kubectl",
                "run",
                "w",
                r#"--overrides={"spec":{"x":1}}"#,
                "--",
                "sh",
                "-c",
                "${HOME}/w {127.0.0.1:9 {addr",
                "/w",
            ]
        );
    }

    #[test]
    fn bin_defaults_to_this_executable() {
        let launcher =
            CommandLauncher::new("srun --ntasks=1 --exact {bin} --worker {addr}").unwrap();
        let argv = launcher.argv(&spec(0)).unwrap();
        assert_eq!(argv[3], std::env::current_exe().unwrap().into_os_string());
    }

    #[test]
    fn hosts_cycle_by_index() {
        let launcher = CommandLauncher::new("ssh {host} w")
            .unwrap()
            .hosts(["a", "b", "c"]);
        let hosts: Vec<String> = (0..7)
            .map(|i| strings(launcher.argv(&spec(i)).unwrap())[1].clone())
            .collect();
        assert_eq!(hosts, ["a", "b", "c", "a", "b", "c", "a"]);
    }

    #[test]
    fn host_placeholder_without_hosts_is_an_error() {
        let launcher = CommandLauncher::new("ssh {host} w --worker {addr}").unwrap();
        let err = launcher.argv(&spec(0)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = launcher.launch(&spec(0)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        // Without `{host}` in the template, no hosts are needed.
        let launcher = CommandLauncher::new("w --worker {addr}").unwrap();
        assert_eq!(
            strings(launcher.argv(&spec(0)).unwrap()),
            ["w", "--worker", "127.0.0.1:9"]
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        for template in ["ssh 'node1 w", r#"ssh "node1 w"#, "", "   "] {
            match CommandLauncher::new(template) {
                Err(Error::Address { addr, source }) => {
                    assert_eq!(addr, template);
                    assert_eq!(source.kind(), io::ErrorKind::InvalidInput);
                }
                other => panic!("{template:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn local_arguments_are_replaced() {
        let launcher =
            LocalLauncher::new("/bin/w").args(["--worker", "{addr}", "-n{index}", "{host}"]);
        assert_eq!(
            strings(launcher.argv(&spec(2)).unwrap()),
            ["/bin/w", "--worker", "127.0.0.1:9", "-n2", "{host}"]
        );
    }

    #[test]
    fn debug_hides_environment_values() {
        let launcher = CommandLauncher::new("w")
            .unwrap()
            .env("PASSWORD", "hunter2");
        let shown = format!("{launcher:?}");
        assert!(
            shown.contains("PASSWORD") && !shown.contains("hunter2"),
            "{shown}"
        );
        let launcher = LocalLauncher::new("w").env("PASSWORD", "hunter2");
        let shown = format!("{launcher:?}");
        assert!(
            shown.contains("PASSWORD") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn local_launch_passes_the_token_in_the_environment() {
        let launcher = LocalLauncher::new("/bin/sh").args([
            "-c",
            "test \"$MALLEABLE_TOKEN\" = secret && test \"$1\" = 127.0.0.1:9 && exit 7",
            "sh",
            "{addr}",
        ]);
        let spec = LaunchSpec {
            token: Some(Token::new("secret").unwrap()),
            ..spec(0)
        };
        let mut launched = launcher.launch(&spec).unwrap();
        assert_eq!(wait(&mut *launched).code(), Some(7));
    }

    #[cfg(unix)]
    #[test]
    fn the_spec_token_wins_over_env() {
        let launcher = LocalLauncher::new("/bin/sh")
            .args(["-c", "test \"$MALLEABLE_TOKEN\" = secret && exit 7"])
            .env(TOKEN_ENV, "other");
        let spec = LaunchSpec {
            token: Some(Token::new("secret").unwrap()),
            ..spec(0)
        };
        let mut launched = launcher.launch(&spec).unwrap();
        assert_eq!(wait(&mut *launched).code(), Some(7));
    }

    #[cfg(unix)]
    #[test]
    fn describe_shows_the_command_line_without_the_token() {
        let launcher = CommandLauncher::new("/bin/sh -c 'exit 0' sh {addr}").unwrap();
        let spec = LaunchSpec {
            token: Some(Token::new("secret").unwrap()),
            ..spec(0)
        };
        let mut launched = launcher.launch(&spec).unwrap();
        let description = launched.describe();
        assert_eq!(description, "/bin/sh -c 'exit 0' sh 127.0.0.1:9");
        assert!(!description.contains("secret"));
        assert!(!format!("{launched:?}").contains("secret"));
        assert!(!format!("{spec:?}").contains("secret"));
        assert_eq!(wait(&mut *launched).code(), Some(0));
    }

    #[cfg(unix)]
    #[test]
    fn kill_stops_and_reaps_and_tolerates_an_exited_process() {
        use std::os::unix::process::ExitStatusExt;

        let mut launched = LocalLauncher::new("/bin/sh")
            .args(["-c", "exec sleep 30"])
            .launch(&spec(0))
            .unwrap();
        launched.kill().unwrap();
        let status = launched.try_wait().unwrap().expect("reaped by kill");
        assert_eq!(status.signal(), Some(9));
        launched.kill().unwrap();

        let mut launched = LocalLauncher::new("/bin/sh")
            .args(["-c", "exit 0"])
            .launch(&spec(0))
            .unwrap();
        wait(&mut *launched);
        launched.kill().unwrap();
    }

    #[test]
    fn a_missing_program_is_an_error() {
        let err = LocalLauncher::new("/nonexistent/malleable-worker")
            .launch(&spec(0))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
