//! The real disk backend (`Disk`, `atomic_file`) on a temp directory: the code every other test replaces with the
//! simulator. What a simulator cannot stand in for is checked here: bytes land where they were written and read back
//! whole, each way of syncing succeeds on a good file and fails on a bad one, a replaced file holds exactly its new
//! content with no temp file left, and every waiter of a batch of replacements is answered, batch after batch.

use super::{fdatasync, Disk, Storage, SyncVia};
use crate::storage::atomic_file;
use std::future::Future;
use std::time::Duration;

/// Runs `f` on a glommio executor, failing (instead of hanging) if it takes more than 20 s.
fn run(f: impl Future<Output = ()>) {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .make()
        .expect("executor")
        .run(async {
            futures_lite::future::or(f, async {
                glommio::timer::sleep(Duration::from_secs(20)).await;
                panic!("a disk operation never answered");
            })
            .await
        })
}

#[test]
fn segment_writes_land_where_they_are_written_and_every_sync_way_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    run(async {
        for (i, via) in [SyncVia::Inline, SyncVia::IoUring, SyncVia::Thread]
            .into_iter()
            .enumerate()
        {
            let disk = Disk::new(via);
            let path = tmp.path().join(format!("{i}.log"));
            let file = disk.open(&path, true).await.unwrap();
            file.write_at(b"hello", 0).unwrap();
            file.write_at(b"world", 5).unwrap();
            file.write_at(&[7u8; 3000], 4096).unwrap();
            file.sync().await.unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.len(), 4096 + 3000, "{via:?}");
            assert_eq!(&bytes[..10], b"helloworld", "{via:?}");
            assert!(bytes[10..4096].iter().all(|&b| b == 0), "{via:?}");
            assert!(bytes[4096..].iter().all(|&b| b == 7), "{via:?}");
            assert_eq!(file.read_at(3, 4).await.unwrap(), b"lowo", "{via:?}");
            // A write the file system refuses (past the largest file it holds: EFBIG) is an error, not a success.
            let e = file
                .write_at(b"x", 1 << 62)
                .expect_err("a write past the file system's largest file must fail");
            assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{via:?}: {e}");
        }
    });
}

#[test]
fn fdatasync_succeeds_on_an_open_file_and_reports_a_bad_descriptor() {
    let tmp = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(tmp.path().join("f")).unwrap();
    use std::os::unix::io::AsRawFd;
    fdatasync(f.as_raw_fd()).expect("fdatasync of an open file");
    let e = fdatasync(-1).expect_err("fdatasync of no file must fail");
    assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
}

#[test]
fn an_atomically_replaced_file_holds_exactly_its_new_bytes_and_no_temp_file_is_left() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("topic.json");
    run(async {
        atomic_file::replace(&path, b"a longer first version".to_vec())
            .await
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"a longer first version");
        atomic_file::replace(&path, b"second".to_vec())
            .await
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert!(!tmp.path().join("topic.json.tmp").exists());
        atomic_file::sync_dir(tmp.path()).await.unwrap();
        atomic_file::sync_dir(&tmp.path().join("missing"))
            .await
            .expect_err("syncing a directory that does not exist must fail");
        let unreachable = tmp.path().join("missing").join("f");
        atomic_file::replace(&unreachable, b"x".to_vec())
            .await
            .expect_err("a file in a directory that does not exist cannot be replaced");
    });
}

#[test]
fn every_waiter_of_a_batch_of_replacements_is_answered_batch_after_batch() {
    let tmp = tempfile::tempdir().unwrap();
    run(async {
        let disk = Disk::new(SyncVia::Thread);
        for round in 0..3u8 {
            let paths: Vec<_> = (0..5)
                .map(|i| tmp.path().join(format!("g{i}.offset")))
                .collect();
            let waits: Vec<_> = paths
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let bytes = vec![round; 12 + i];
                    if i % 2 == 0 {
                        disk.replace(p, bytes)
                    } else {
                        disk.overwrite_small(p, bytes)
                    }
                })
                .collect();
            for w in waits {
                w.await.unwrap();
            }
            for (i, p) in paths.iter().enumerate() {
                assert_eq!(
                    std::fs::read(p).unwrap(),
                    vec![round; 12 + i],
                    "round {round}"
                );
            }
        }
    });
}
