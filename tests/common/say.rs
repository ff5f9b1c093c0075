//! A line on the terminal past the test harness's capture, for test binaries that do not include
//! `common` (`eprintln!` inside a passing test is swallowed, so a skip would go unsaid on
//! `cargo test`).

/// Say `line` once per test binary.
pub fn say(line: &str) {
    use std::io::Write;
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !said.iter().any(|l| l == line) {
        said.push(line.to_string());
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}
