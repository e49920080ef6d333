//! `snapshots`: list, inspect, verify and delete the snapshots of malleable jobs.
//!
//! ```text
//! snapshots ls URL                 every job and its committed epochs, with size and age
//! snapshots show URL ID            what a snapshot holds: job, phase, progress, chunks, parts
//! snapshots verify URL ID          read every part and check every checksum
//! snapshots rm URL ID              delete one snapshot (and its parts no other one uses)
//! snapshots gc URL JOB [--keep K] [--uncommitted]
//!                                  delete leftovers; with --keep, all but the newest K
//! ```
//!
//! `URL` is a store URL (`file:///path`, `s3://bucket/prefix` with the `s3` feature) or a
//! folder's path (`./snapshots`); `ID` is `job-id@epoch`, or `job-id` for its newest
//! committed snapshot. S3 stores read the usual `AWS_*` environment variables, and
//! `-o KEY=VALUE` sets a store option (`endpoint`, `region`, `allow_http`, …). The command
//! never creates a store: a folder that does not exist is an error. Every error prints one
//! line (with its causes, each once) to stderr and exits with status 1.
//!
//! `gc` deletes the leftovers of an epoch that was never committed (a writer that crashed
//! between its parts and its manifest) when the epoch is below the newest committed one, or
//! when nothing was written in it for a day ([`ABANDONED_AFTER`]); a more recent one above
//! the newest commit may be a snapshot being written right now, and is only listed, unless
//! `--uncommitted` says that no program is writing snapshots of the job.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use malleable::snapshot::{
    ABANDONED_AFTER, Error, Manifest, SnapshotId, Store, Uncommitted, check_job_id,
};

/// List, inspect, verify and delete snapshots of malleable jobs.
#[derive(Debug, Parser)]
#[command(name = "snapshots", version)]
struct Cli {
    /// A store option, KEY=VALUE (for s3://: endpoint, region, allow_http, access_key_id,
    /// secret_access_key, …); repeatable. AWS_* environment variables are read as well.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE", global = true,
          value_parser = parse_option)]
    options: Vec<(String, String)>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List every job and its committed snapshots, with size and age.
    Ls {
        /// The store: a folder's path, file:///path, s3://bucket/prefix.
        url: String,
    },
    /// Show what a snapshot holds: job, phase, progress, chunks, parts.
    Show {
        /// The store.
        url: String,
        /// job-id@epoch, or job-id for its newest snapshot.
        id: String,
    },
    /// Read every part of a snapshot and check every size and checksum.
    Verify {
        /// The store.
        url: String,
        /// job-id@epoch, or job-id for its newest snapshot.
        id: String,
    },
    /// Delete a snapshot: its manifest, then its parts that no other snapshot uses.
    Rm {
        /// The store.
        url: String,
        /// job-id@epoch, or job-id for its newest snapshot.
        id: String,
    },
    /// Delete leftovers of a job (parts of uncommitted or lost snapshots); with --keep K, also
    /// every committed snapshot but the newest K (the newest is always kept). An uncommitted
    /// epoch above the newest committed one is deleted once nothing was written in it for a
    /// day; a more recent one may be a snapshot being written, and is kept unless
    /// --uncommitted is given.
    Gc {
        /// The store.
        url: String,
        /// The job id.
        job: String,
        /// How many committed snapshots to keep (at least 1).
        #[arg(long)]
        keep: Option<usize>,
        /// Also delete every uncommitted epoch above the newest committed one, however
        /// recent: only when no program is writing snapshots of this job.
        #[arg(long)]
        uncommitted: bool,
    },
}

fn parse_option(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {text:?}")),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout and succeed; usage errors fail with status 1.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("snapshots: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("snapshots: error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once.
fn chain(e: &Error) -> String {
    malleable::error_chain(e)
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    // A reader's open: a folder that does not exist is an error, never created.
    let open = |url: &str| Store::open_existing(url, cli.options.clone());
    match &cli.command {
        Command::Ls { url } => ls(&open(url)?).await,
        Command::Show { url, id } => {
            let store = open(url)?;
            show(&store, &resolve(&store, id).await?).await
        }
        Command::Verify { url, id } => {
            let store = open(url)?;
            verify(&store, &resolve(&store, id).await?).await
        }
        Command::Rm { url, id } => {
            let store = open(url)?;
            let id = resolve(&store, id).await?;
            let cleanup = store.remove(&id).await?;
            println!(
                "removed {id}: {} objects deleted, {} freed",
                cleanup.deleted.len(),
                size(cleanup.freed_bytes)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc {
            url,
            job,
            keep,
            uncommitted,
        } => {
            let store = open(url)?;
            let rule = if *uncommitted {
                Uncommitted::Delete
            } else {
                Uncommitted::IdleFor(ABANDONED_AFTER)
            };
            let cleanup = store.gc_with(job, *keep, rule).await?;
            let epochs = |e: &[u64]| {
                if e.is_empty() {
                    "none".to_owned()
                } else {
                    e.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                }
            };
            println!("job {job}: kept epochs {}", epochs(&cleanup.kept_epochs));
            println!("removed epochs {}", epochs(&cleanup.removed_epochs));
            println!(
                "removed uncommitted epochs {}",
                epochs(&cleanup.removed_uncommitted)
            );
            if !cleanup.left_uncommitted.is_empty() {
                println!(
                    "left uncommitted epochs {}: above the newest commit and written to within \
                     a day, a snapshot may be being written there (--uncommitted deletes them \
                     if no program writes snapshots of {job})",
                    epochs(&cleanup.left_uncommitted)
                );
            }
            println!(
                "{} objects deleted, {} freed",
                cleanup.deleted.len(),
                size(cleanup.freed_bytes)
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `job@epoch`, or `job` for its newest committed snapshot.
async fn resolve(store: &Store, id: &str) -> Result<SnapshotId, Error> {
    if id.contains('@') {
        return id.parse();
    }
    check_job_id(id)?;
    store.latest(id).await?.ok_or_else(|| Error::NotFound {
        what: format!("a committed snapshot of job {id:?} in {}", store.url()),
    })
}

async fn ls(store: &Store) -> Result<ExitCode, Error> {
    let jobs = store.jobs().await?;
    if jobs.is_empty() {
        println!("no jobs in {}", store.url());
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<40} {:>8} {:>10} {:>8}", "JOB", "EPOCH", "SIZE", "AGE");
    for job in jobs {
        let snapshots = store.snapshots(&job).await?;
        if snapshots.is_empty() {
            println!("{job:<40} {:>8}", "-");
        }
        for info in snapshots {
            let epoch = info.id.epoch;
            match store.manifest(&info.id).await {
                Ok(m) => println!(
                    "{job:<40} {epoch:>8} {:>10} {:>8}",
                    size(info.manifest_size.saturating_add(m.parts_size())),
                    age_ms(m.created_unix_ms)
                ),
                Err(e) => println!(
                    "{job:<40} {epoch:>8} {:>10} {:>8}  unreadable: {}",
                    size(info.manifest_size),
                    age(info.modified),
                    chain(&e)
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(store: &Store, id: &SnapshotId) -> Result<ExitCode, Error> {
    let m: Manifest = store.manifest(id).await?;
    let manifest_size = store
        .snapshots(&id.job_id)
        .await?
        .into_iter()
        .find(|info| info.id == *id)
        .map_or(0, |info| info.manifest_size);
    let progress = if m.iterations_total == 0 {
        "-".to_owned()
    } else {
        format!(
            "{:.1}%",
            m.iterations_done as f64 * 100.0 / m.iterations_total as f64
        )
    };
    let pending = m
        .chunks
        .saturating_sub(m.merged)
        .saturating_sub(m.done.len() as u64)
        .saturating_sub(m.parts.len() as u64);
    println!("snapshot   {id}");
    println!("job        {}", m.job_name);
    println!("format     version {}", m.format_version);
    println!("age        {}", age_ms(m.created_unix_ms));
    println!(
        "phase      {} ({} iterations in earlier phases)",
        m.phase, m.iterations_before
    );
    println!(
        "progress   {progress} ({} of {} iterations)",
        m.iterations_done, m.iterations_total
    );
    println!(
        "chunks     {} ({} merged, {} done, {} suspended, {pending} pending)",
        m.chunks,
        m.merged,
        m.done.len(),
        m.parts.len()
    );
    if m.kept.is_empty() {
        println!("parts      {}, {}", m.parts.len(), size(m.parts_size()));
    } else {
        // A job with owned partitions: every chunk's partition is a part, pending or kept.
        let sum = |p: &[malleable::snapshot::PartRef]| p.iter().map(|p| p.size).sum::<u64>();
        println!(
            "parts      {}, {} ({} partitions of pending chunks, {}; {} kept by done chunks, {})",
            m.parts.len() + m.kept.len(),
            size(m.parts_size()),
            m.parts.len(),
            size(sum(&m.parts)),
            m.kept.len(),
            size(sum(&m.kept))
        );
    }
    println!("job value  {}", size(m.job.len() as u64));
    println!("manifest   {}", size(manifest_size));
    Ok(ExitCode::SUCCESS)
}

async fn verify(store: &Store, id: &SnapshotId) -> Result<ExitCode, Error> {
    let m = store.manifest(id).await?;
    let mut failed = 0usize;
    for part in m.all_parts() {
        match store.get_part(part).await {
            Ok(_) => println!(
                "ok      chunk {:>6}  {}  {}",
                part.chunk,
                size(part.size),
                part.key
            ),
            Err(e) => {
                failed += 1;
                println!(
                    "FAILED  chunk {:>6}  {}: {}",
                    part.chunk,
                    part.key,
                    chain(&e)
                );
            }
        }
    }
    if failed == 0 {
        println!(
            "{id}: manifest and {} parts ({}) verified",
            m.parts.len() + m.kept.len(),
            size(m.parts_size())
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "snapshots: error: {id}: {failed} of {} parts failed verification",
            m.parts.len() + m.kept.len()
        );
        Ok(ExitCode::FAILURE)
    }
}

/// A byte count in binary units.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn age_ms(unix_ms: u64) -> String {
    // A hostile manifest may hold any number: no `+`, which panics on overflow.
    match UNIX_EPOCH.checked_add(Duration::from_millis(unix_ms)) {
        Some(then) => age(then),
        None => "future".to_owned(),
    }
}

/// How long ago `then` was, coarsely ("3h ago"); "in the future" for clock skew.
fn age(then: SystemTime) -> String {
    let Ok(ago) = SystemTime::now().duration_since(then) else {
        return "future".to_owned();
    };
    let s = ago.as_secs();
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}
