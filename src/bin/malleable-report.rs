//! `malleable-report`: turns a run's timeline into a self-contained HTML report.
//!
//! ```text
//! malleable-report TIMELINE [-o REPORT.html]
//! ```
//!
//! `TIMELINE` is the file of `Builder::timeline` (JSON lines); the report (one page, with an
//! inline SVG chart of the time per phase and the worker count over the run, with scaling and
//! snapshot marks) goes to `-o`, by default `TIMELINE` with the extension `.html`. Every
//! error prints one line (with its causes) to stderr and exits with status 1.

use std::error::Error as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Turn a malleable timeline (JSON lines) into an HTML report.
#[derive(Debug, Parser)]
#[command(name = "malleable-report", version)]
struct Cli {
    /// The timeline: the file of `Builder::timeline`.
    timeline: PathBuf,
    /// Where the report goes (default: the timeline's path with the extension .html).
    #[arg(short, long, value_name = "REPORT.html")]
    output: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(out) => {
            println!("{}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut line = e.to_string();
            let mut cur = e.source();
            while let Some(c) = cur {
                line.push_str(": ");
                line.push_str(&c.to_string());
                cur = c.source();
            }
            eprintln!("malleable-report: {line}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Read(#[from] malleable::timeline::Error),
    #[error("cannot write the report {path}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn run(cli: &Cli) -> Result<PathBuf, Error> {
    let records = malleable::timeline::read(&cli.timeline)?;
    let html = malleable::timeline::report::html(&records);
    let out = cli
        .output
        .clone()
        .unwrap_or_else(|| cli.timeline.with_extension("html"));
    std::fs::write(&out, html).map_err(|source| Error::Write {
        path: out.clone(),
        source,
    })?;
    Ok(out)
}
