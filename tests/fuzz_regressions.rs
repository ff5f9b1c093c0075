//! The fuzz targets' checks (`fuzz/checks.rs`) over every seed of `fuzz/corpus/<target>/` and every
//! input kept in `fuzz/regressions/<target>/` (a crash `fuzz/run.sh` found, kept once fixed), on
//! stable and without libFuzzer: a crash fixed stays fixed, and the seeds stay meaningful.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

#[path = "../fuzz/checks.rs"]
mod checks;

use std::path::Path;

/// A target's check: panics when a promise breaks.
type Check = fn(&[u8]);

const TARGETS: [(&str, Check); 8] = [
    ("money", checks::money),
    ("scope_peek", checks::scope_peek),
    ("jwt", checks::jwt),
    ("mandate", checks::mandate),
    ("request_state", checks::request_state),
    ("rail_callbacks", checks::rail_callbacks),
    ("cursor", checks::cursor),
    ("time_filter", checks::time_filter),
];

#[test]
fn every_seed_and_every_kept_crash_passes_its_targets_checks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for (target, check) in TARGETS {
        assert!(root.join("fuzz_targets").join(format!("{target}.rs")).is_file(), "{target}: no such fuzz target");
        let mut seeds = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
            for entry in entries {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| check(&data));
                assert!(outcome.is_ok(), "{target}: {} breaks its check", path.display());
                seeds += usize::from(dir == "corpus");
            }
        }
        assert!(seeds > 0, "{target}: no seed corpus in fuzz/corpus/{target}");
    }
}

/// The signed targets start from values that verify: unedited (`0x80, 0`, nothing written) each
/// passes its check, which asserts it verifies; edited, each is refused (the checks assert that
/// too). A check that never saw a valid value would prove nothing.
#[test]
fn the_signed_targets_start_from_values_that_verify() {
    for check in [checks::jwt, checks::mandate, checks::request_state] {
        check(&[0x80, 0]);
        check(&[0x80, 128, b'#']);
    }
}
