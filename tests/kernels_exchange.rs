//! The examples whose partitions exchange pieces (`heat3d`: faces with neighbours, `cg`: an
//! allgather, `ft`: all-to-all transposes) as smoke tests: each runs its malleable job at
//! 0, 1 and 3 local workers and gets the sequential kernel's bits; and a run that grows,
//! shrinks, is suspended and resumed with another worker count gets them too.

// Each example includes `examples/kernels/` itself, as the program it is; three of them in
// one test binary (rather than three binaries, each linking the whole crate) are three
// copies of the kernels, one per example, each tested as that example builds it.
#![allow(clippy::duplicate_mod)]

use std::time::Duration;

use malleable::{At, Executor, Outcome};

#[allow(dead_code)]
#[path = "../examples/heat3d.rs"]
mod heat3d_example;

#[allow(dead_code)]
#[path = "../examples/cg.rs"]
mod cg_example;

#[allow(dead_code)]
#[path = "../examples/ft.rs"]
mod ft_example;

use heat3d_example::kernels::heat3d;

#[test]
fn heat3d_pencils_exchanging_faces_give_the_sequential_bits() {
    for (workers, cut) in [(0, [2, 2]), (1, [3, 1]), (3, [4, 3])] {
        let args = heat3d_example::Args {
            n: 13,
            cut,
            phases: 7,
            workers,
            processes: false,
        };
        assert!(
            heat3d_example::run(&args).unwrap(),
            "{workers} workers, {cut:?}"
        );
    }
}

#[test]
fn cg_gathering_the_search_direction_gives_the_sequential_bits() {
    for (workers, blocks) in [(0, 3), (1, 1), (3, 10)] {
        let args = cg_example::Args {
            side: 7,
            iterations: 6,
            blocks,
            workers,
            processes: false,
        };
        assert!(
            cg_example::run(&args).unwrap(),
            "{workers} workers, {blocks} blocks"
        );
    }
}

#[test]
fn ft_transposing_all_to_all_gives_the_sequential_bits() {
    for (workers, parts) in [(0, 2), (1, 1), (3, 5)] {
        let args = ft_example::Args {
            ny: 16,
            nx: 32,
            steps: 3,
            parts,
            workers,
            processes: false,
        };
        assert!(
            ft_example::run(&args).unwrap(),
            "{workers} workers, {parts} parts"
        );
    }
}

/// A folder for a snapshot store, empty, and its URL.
fn store(name: &str) -> (String, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "malleable-kernels-exchange-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (format!("file://{}", dir.display()), dir)
}

#[test]
fn heat3d_grown_shrunk_suspended_and_resumed_gives_the_sequential_bits() {
    let args = heat3d_example::Args {
        n: 16,
        cut: [3, 2],
        phases: 400,
        workers: 1,
        processes: false,
    };
    let (url, dir) = store("heat3d");
    let exec = Executor::builder()
        .local_workers(1)
        .snapshots(url.clone())
        .build()
        .unwrap();
    let handle = exec.submit(heat3d_example::job(&args).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    handle.set_local_workers(3);
    std::thread::sleep(Duration::from_millis(20));
    handle.set_local_workers(2);
    handle.suspend().wait().unwrap();
    let Outcome::Suspended(_) = handle.wait().unwrap() else {
        panic!("the job finished before it was suspended: make it longer");
    };
    let resumed = Executor::builder()
        .local_workers(3)
        .build()
        .unwrap()
        .resume::<heat3d_example::Heat3d>(&url, At::Latest)
        .unwrap();
    assert!(resumed.progress().phase > 0, "resumed from the start");
    let done = resumed.wait().unwrap().finished().unwrap();
    let reference = heat3d::sequential(heat3d::Dims::cube(args.n), args.phases);
    assert_eq!(heat3d_example::digest(&done), reference.digest);
    let _ = std::fs::remove_dir_all(dir);
}
