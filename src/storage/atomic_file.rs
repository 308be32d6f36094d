//! Small files replaced atomically: temp file, fdatasync, rename, directory fsync, all through glommio's io_uring
//! file API. Used for `consumer.offset` and `topic.json`.

use glommio::io::{Directory, OpenOptions};
use std::path::Path;

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content, never a mix.
pub async fn replace(path: &Path, bytes: Vec<u8>) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("file has no parent directory"))?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .buffered_open(&tmp)
        .await
        .map_err(std::io::Error::from)?;
    let len = bytes.len();
    let written = file
        .write_at(bytes, 0)
        .await
        .map_err(std::io::Error::from)?;
    if written != len {
        return Err(std::io::Error::other("short write"));
    }
    file.fdatasync().await.map_err(std::io::Error::from)?;
    file.close().await.map_err(std::io::Error::from)?;
    glommio::io::rename(&tmp, path)
        .await
        .map_err(std::io::Error::from)?;
    sync_dir(dir).await
}

/// fsyncs a directory so that a created, renamed or removed entry in it survives a power loss.
pub async fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let handle = Directory::open(dir).await.map_err(std::io::Error::from)?;
    handle.sync().await.map_err(std::io::Error::from)?;
    handle.close().await.map_err(std::io::Error::from)
}
