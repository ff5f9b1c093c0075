//! A secret string whose `Debug` never shows it: keys, credentials, passkeys. Its own module (not
//! `auth`'s) because config, the rails and the stores hold secrets too.

use serde::Deserialize;

#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Self {
        Secret(s)
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
