//! Files only paygate's own user may read: the data directory (0700), the SQLite database and its
//! `-wal` and `-shm` files (0600; SQLite gives its journal files the database file's mode), the audit
//! archive directory (0700) and its files (0600), whatever the process umask. They hold the audit
//! trail, memos and issued mandates, and the key files.
//!
//! Modes are set when paygate creates the file or directory; database files found with looser
//! modes are tightened when the store opens them (they are paygate's), and `paygate doctor` reports
//! any of these readable by others.

use std::path::Path;

/// Create `dir` (and missing parents) owner-only. An existing directory is left as it is (it may
/// be the operator's); `doctor` reports it when others can read it.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Make sure the database file at `path` exists owner-only before SQLite opens it (so the `-wal`
/// and `-shm` files it creates are owner-only too), and tighten it and its journal files if an
/// earlier version left them readable by others. Returns the files it tightened.
pub fn prepare_database(path: &Path) -> std::io::Result<Vec<String>> {
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    drop(open.open(path)?);
    let mut tightened = Vec::new();
    #[cfg(unix)]
    for file in database_files(path) {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::symlink_metadata(&file) else { continue };
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
            tightened.push(file.display().to_string());
        }
    }
    Ok(tightened)
}

/// The database file and the journal files SQLite keeps beside it.
pub fn database_files(path: &Path) -> Vec<std::path::PathBuf> {
    let name = path.as_os_str().to_os_string();
    let with = |suffix: &str| {
        let mut n = name.clone();
        n.push(suffix);
        std::path::PathBuf::from(n)
    };
    vec![path.to_path_buf(), with("-wal"), with("-shm")]
}

/// Why `path` is readable by others, if it exists and is: its mode. `None` when it is absent or
/// owner-only (or the platform has no modes).
pub fn open_to_others(path: &Path) -> Option<u32> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// Create `path` for writing, owner-only, refusing to follow a symbolic link or to reuse anything
/// already there (`O_CREAT | O_EXCL | O_NOFOLLOW`): a link planted where a temporary file goes
/// cannot redirect the write.
pub fn create_new_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    open.open(path)
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_database_files_are_owner_only_whatever_was_there() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700, "parents made along the way too");
        let db = dir.join("paygate.sqlite3");
        assert!(prepare_database(&db).unwrap().is_empty());
        assert_eq!(mode(&db), 0o600);
        // Left loose by an earlier version: tightened.
        let wal = dir.join("paygate.sqlite3-wal");
        std::fs::write(&wal, b"").unwrap();
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(open_to_others(&db), Some(0o644));
        assert_eq!(prepare_database(&db).unwrap().len(), 2);
        assert_eq!((mode(&db), mode(&wal)), (0o600, 0o600));
        assert_eq!(open_to_others(&db), None);
    }

    #[test]
    fn a_planted_link_or_leftover_is_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, b"keep").unwrap();
        let link = tmp.path().join("x.partial");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_new_private(&link).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let fresh = tmp.path().join("y.partial");
        drop(create_new_private(&fresh).unwrap());
        assert_eq!(mode(&fresh), 0o600);
        assert!(create_new_private(&fresh).is_err(), "never reuses a file already there");
    }
}
