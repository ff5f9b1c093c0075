//! What Kenya's mobile-money rails (M-Pesa, Airtel Money) share: the written forms of a mobile
//! number, amounts in whole shillings, and the text a payer sees. Each rail adds its own ranges and
//! limits; nothing here names a vendor.

use crate::domain::money::{Currency, Money};

/// The currency both rails speak.
pub const CURRENCY: &str = "KES";

/// A Kenyan mobile number, kept as `2547XXXXXXXX` / `2541XXXXXXXX` (what records and payer
/// accounts hold). Made only by a rail's `normalize_phone`, which checks its own ranges.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Msisdn(String);

impl Msisdn {
    /// From the nine digits [`subscriber`] returned (after the rail checked its ranges).
    pub(crate) fn from_subscriber(subscriber: &str) -> Msisdn {
        Msisdn(format!("254{subscriber}"))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The nine digits after the country code (Airtel's `subscriber.msisdn`).
    pub fn subscriber(&self) -> &str {
        &self.0[3..]
    }
}

impl std::fmt::Display for Msisdn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The 9-digit subscriber part of a Kenyan mobile number written as `07XXXXXXXX`, `01XXXXXXXX`,
/// `7XXXXXXXX`, `1XXXXXXXX`, `254…` or `+254…`; spaces and dashes are ignored. `expected` ends
/// every refusal ("expected a Kenyan mobile number such as …"). The rail checks its own ranges.
pub fn subscriber(input: &str, expected: &str) -> Result<String, String> {
    let compact: String = input.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
    if compact.is_empty() {
        return Err(format!("phone number is empty: {expected}"));
    }
    let digits = compact.strip_prefix('+').unwrap_or(&compact);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("phone number may contain only digits, spaces, dashes and a leading '+': {expected}"));
    }
    if compact.starts_with('+') && !digits.starts_with("254") {
        return Err(format!("phone number must be Kenyan (+254): {expected}"));
    }
    match digits.len() {
        12 if digits.starts_with("254") => Ok(digits[3..].to_string()),
        10 if digits.starts_with('0') => Ok(digits[1..].to_string()),
        9 => Ok(digits.to_string()),
        _ => Err(format!("phone number has the wrong number of digits: {expected}")),
    }
}

/// A decimal amount in KES that is a whole number of shillings (neither rail takes cents). The
/// refusal names the rail ("M-Pesa amounts are whole shillings, …").
pub fn whole_shillings(amount: &str, rail: &str) -> Result<Money, String> {
    let kes = Currency::parse(CURRENCY).map_err(|e| e.to_string())?;
    let amount = Money::parse(amount, kes).map_err(|e| e.to_string())?;
    if amount.minor() % 100 != 0 {
        return Err(format!("{rail} amounts are whole shillings, e.g. \"150\" or \"150.00\""));
    }
    Ok(amount)
}

/// Text the payer sees on their phone or statement: printable, non-empty, within the rail's
/// limit (characters, not bytes). The refusal reads after the argument's name.
pub fn customer_text(value: &str, chars_max: usize) -> Result<String, String> {
    let v = value.trim();
    if v.is_empty() || v.chars().count() > chars_max {
        return Err(format!("must be 1-{chars_max} characters"));
    }
    if let Some(why) = crate::domain::text::refusal(v) {
        return Err(why);
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_written_form_gives_the_same_subscriber() {
        for input in ["0712345678", "712345678", "254712345678", "+254712345678", "+254 712-345-678"] {
            assert_eq!(subscriber(input, "x").as_deref(), Ok("712345678"), "{input}");
        }
        for input in ["", "07123", "+1 555 0100", "07l2345678", "2547123456789"] {
            assert!(subscriber(input, "x").is_err(), "{input}");
        }
    }

    #[test]
    fn amounts_are_whole_shillings_and_texts_are_printable() {
        assert_eq!(whole_shillings("150.00", "R").map(|m| m.minor()), Ok(15_000));
        assert_eq!(
            whole_shillings("150.50", "R").unwrap_err(),
            "R amounts are whole shillings, e.g. \"150\" or \"150.00\""
        );
        assert!(whole_shillings("cents", "R").is_err());
        assert_eq!(customer_text(" INV-1 ", 5).as_deref(), Ok("INV-1"));
        assert!(
            customer_text("INV-12", 5).is_err()
                && customer_text("  ", 5).is_err()
                && customer_text("a\u{7}", 5).is_err()
        );
    }
}
