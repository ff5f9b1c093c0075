//! Finding 5 of the authority review: under umask 022 the data directory was 0755 and the SQLite
//! database, `-wal` and `-shm` 0644 (they hold the audit trail, memos and issued mandates), the
//! archive directory had default permissions, and its `.partial` file followed symbolic links.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test
#![cfg(unix)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;
use serde_json::json;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777
}

#[tokio::test]
async fn the_data_directory_and_database_files_are_owner_only_under_any_umask() {
    // The usual umask, said explicitly: what would make files 0644 without the fix.
    // SAFETY: umask has no memory effects; it only sets this process's file-creation mask.
    unsafe { libc::umask(0o022) };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let app = spawn_on(&data, &[]).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&c, "create_payment", json!({"operation_id": "perm-1", "from_account": "acct-A", "to_account": "acct-B", "amount": "1.00", "currency": "KES"})).await);
    let db = data.join("paygate.sqlite3");
    assert_eq!(mode(&data), 0o700, "the data directory");
    for file in paygate::private_fs::database_files(&db) {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    for key in ["dev-signing.key", "idempotency.key", "mandate.key"] {
        assert_eq!(mode(&data.join(key)), 0o600, "{key}");
    }
    let _ = c.cancel().await;
    app.stop().await;

    // An older version's loose modes are tightened when the store opens the files again.
    for file in paygate::private_fs::database_files(&db) {
        if file.exists() {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let app = spawn_on(&data, &[]).await;
    for file in paygate::private_fs::database_files(&db) {
        if file.exists() {
            assert_eq!(mode(&file), 0o600, "tightened: {}", file.display());
        }
    }
    app.stop().await;

    // `paygate doctor` reports a directory others can read.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let env = vec![("PAYGATE_STORAGE__DATA_DIR".to_string(), data.display().to_string())];
    let report = paygate::cli::doctor::run(None, env.clone()).await;
    let text = report.render();
    let files = text.lines().find(|l| l.contains("files")).unwrap_or_else(|| panic!("{text}"));
    assert!(files.starts_with('✗') && files.contains("mode 755"), "{text}");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let text = paygate::cli::doctor::run(None, env).await.render();
    assert!(text.lines().any(|l| l.starts_with('✓') && l.contains("files")), "{text}");
}

#[tokio::test]
async fn the_audit_archive_is_owner_only_and_never_writes_through_a_planted_link() {
    // SAFETY: as above.
    unsafe { libc::umask(0o022) };
    let tmp = tempfile::tempdir().unwrap();
    let store = paygate::store::sqlite::SqliteStore::open(&tmp.path().join("db.sqlite3")).unwrap();
    for at in [10, 11] {
        let rec = paygate::domain::audit::AuditRecord {
            seq: 0,
            at,
            correlation_id: "corr_x".into(),
            principal_iss: "iss".into(),
            principal_sub: "agent".into(),
            principal_user: None,
            tool: "get_balance".into(),
            decision: "denied".into(),
            code: None,
            idempotency_key: None,
            payment_id: None,
            approval_id: None,
            detail: None,
            repeats: 1,
            policy_version: None,
            intent: None,
            tag: None,
        };
        // Tagged as the gateway tags every record (the sealer never seals an untagged one).
        let rec = paygate::domain::audit_chain::tagged(
            &paygate::domain::audit_chain::LinkKey::new([7; 32]),
            rec,
            rand_nonce(),
        );
        paygate::store::AuditStore::audit_append(&store, rec).await.unwrap();
    }
    let dir = tmp.path().join("archive");
    let settings = paygate::audit_archive::Settings { retention_secs: 100, dir: dir.clone(), batch_max: 100 };
    // Someone plants a link where the next batch's temporary file goes, pointing at a file of theirs.
    paygate::private_fs::create_dir(&dir).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"untouched").unwrap();
    let partial = dir.join(format!("audit-{:020}-{:020}.jsonl.partial", 1, 2));
    std::os::unix::fs::symlink(&victim, &partial).unwrap();
    let keys = paygate::mandate::MandateKeys::new(
        paygate::mandate::KeySchedule::new("mk1"),
        &paygate::secret::Secret::new("k".repeat(32)),
    )
    .unwrap();
    let link_key = paygate::domain::audit_chain::LinkKey::new([7; 32]);
    let keys = paygate::audit_chain::Sealer {
        links: &link_key,
        signer: &keys,
        notice: paygate::domain::webhook::Notice::default(),
        keep_every_secs: 0,
        genesis_within_secs: i64::MAX / 2,
    };
    let done = paygate::audit_archive::archive(&store, &keys, &settings, 1_000).await.unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(std::fs::read(&victim).unwrap(), b"untouched", "the link was removed, not written through");
    assert_eq!(paygate::audit_archive::read(&done[0].file).unwrap().len(), 2);
    assert_eq!(mode(&done[0].file), 0o600, "the archive file");
    assert_eq!(mode(&dir), 0o700, "the archive directory");
    // A directory paygate makes itself is owner-only too.
    let fresh = tmp.path().join("elsewhere/archive");
    let settings = paygate::audit_archive::Settings { retention_secs: 1, dir: fresh.clone(), batch_max: 100 };
    paygate::store::AuditStore::audit_append(
        &store,
        paygate::domain::audit_chain::tagged(
            &link_key,
            paygate::domain::audit::AuditRecord {
                at: 500,
                ..paygate::audit_archive::read(&done[0].file).unwrap()[0].clone()
            },
            rand_nonce(),
        ),
    )
    .await
    .unwrap();
    paygate::audit_archive::archive(&store, &keys, &settings, 1_000).await.unwrap();
    assert_eq!(mode(&fresh), 0o700);
}

/// A fresh tag nonce.
fn rand_nonce() -> [u8; 8] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed).to_be_bytes()
}
