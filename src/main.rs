//! The `paygate` command line: everything it does lives in the library (`paygate::cli`).

/// mimalloc instead of glibc's malloc: a request allocates and frees many small buffers across
/// tokio's worker threads (JSON, headers, rows), which glibc's arenas serve with locks and
/// consolidation (17% of a payment's server CPU in the profile).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    paygate::cli::run()
}
