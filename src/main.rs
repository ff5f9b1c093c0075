//! The `paygate` command line: everything it does lives in the library (`paygate::cli`).

fn main() -> std::process::ExitCode {
    paygate::cli::run()
}
