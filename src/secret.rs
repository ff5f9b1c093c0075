//! A secret string whose `Debug` never shows it: keys, credentials, passkeys. Its own module (not
//! `auth`'s) because config, the rails and the stores hold secrets too. Every secret, however it is
//! made (config, a key file, a rail's access token), is registered with the log redactor, so even a
//! dependency that prints it writes `[redacted:secret]`.

use serde::Deserialize;

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

impl Secret {
    pub fn new(s: String) -> Self {
        crate::logging::register_secret(&s);
        Secret(s)
    }
    /// Whether `presented` is this secret, compared as SHA-256 digests without an early exit, so
    /// the time taken says nothing about how much of a guess was right.
    pub fn matches(&self, presented: &str) -> bool {
        use sha2::{Digest, Sha256};
        let a: [u8; 32] = Sha256::digest(self.0.as_bytes()).into();
        let b: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
    /// The only way to read it. Call sites are few and greppable.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_itself_and_never_prints() {
        let s = Secret::new("metrics-token-0123456789".into());
        assert!(s.matches("metrics-token-0123456789"));
        assert!(!s.matches("metrics-token-012345678") && !s.matches("") && !s.matches("x"));
        assert_eq!(format!("{s:?}"), "Secret(***)");
    }
}
