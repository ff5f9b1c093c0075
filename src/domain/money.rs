//! Money as integer minor units. Amounts arrive as decimal strings and are parsed exactly by the
//! currency's exponent; floats never appear anywhere in the money path.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why an amount or currency string was refused. Messages are safe to show to an agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("currency must be a supported ISO 4217 code (e.g. KES, USD), got {0:?}")]
    UnknownCurrency(String),
    #[error("amount must be a plain decimal string like \"50.00\" (no signs, exponents or spaces), got {0:?}")]
    Malformed(String),
    #[error("amount {amount:?} has more than {exponent} decimal places for {currency}")]
    TooManyDecimals { amount: String, currency: Currency, exponent: u32 },
    #[error("amount must be greater than zero")]
    NotPositive,
    #[error("amount is too large")]
    TooLarge,
}

/// A supported ISO 4217 currency. The list is deliberately closed: an unknown code is an error,
/// never a guess at its exponent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Currency(&'static str, u32);

impl Serialize for Currency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Currency::parse(&s).map_err(serde::de::Error::custom)
    }
}

const CURRENCIES: &[(&str, u32)] = &[
    ("KES", 2),
    ("USD", 2),
    ("EUR", 2),
    ("GBP", 2),
    ("UGX", 0),
    ("TZS", 2),
    ("RWF", 0),
    ("NGN", 2),
    ("ZAR", 2),
    ("JPY", 0),
    ("KWD", 3),
    ("BHD", 3),
];

impl Currency {
    pub fn parse(code: &str) -> Result<Self, MoneyError> {
        CURRENCIES
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(c, e)| Currency(c, *e))
            .ok_or_else(|| MoneyError::UnknownCurrency(code.chars().take(16).collect()))
    }
    pub fn code(&self) -> &'static str {
        self.0
    }
    /// Number of decimal places of the minor unit (KES 2, JPY 0, KWD 3).
    pub fn exponent(&self) -> u32 {
        self.1
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The largest amount paygate accepts in minor units (10^15: a quadrillion cents). Keeps every sum
/// of a day's postings far inside i64.
pub const AMOUNT_MINOR_MAX: i64 = 1_000_000_000_000_000;

/// A strictly positive amount of money in integer minor units of one currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Money {
    minor: i64,
    currency: Currency,
}

impl Money {
    /// Parse a decimal string exactly: digits, optionally one '.' and at most `exponent` decimals.
    pub fn parse(amount: &str, currency: Currency) -> Result<Self, MoneyError> {
        Self::from_minor(parse_minor(amount, currency)?, currency)
    }

    pub fn from_minor(minor: i64, currency: Currency) -> Result<Self, MoneyError> {
        if minor <= 0 {
            return Err(MoneyError::NotPositive);
        }
        if minor > AMOUNT_MINOR_MAX {
            return Err(MoneyError::TooLarge);
        }
        Ok(Money { minor, currency })
    }

    pub fn minor(&self) -> i64 {
        self.minor
    }
    pub fn currency(&self) -> Currency {
        self.currency
    }
    /// The canonical decimal string ("50.00").
    pub fn to_decimal(&self) -> String {
        format_minor(self.minor, self.currency)
    }
}

/// Parse a non-negative decimal string exactly into minor units (zero allowed: opening balances).
pub fn parse_minor(amount: &str, currency: Currency) -> Result<i64, MoneyError> {
    let malformed = || MoneyError::Malformed(amount.chars().take(32).collect());
    let (int_part, frac_part) = match amount.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (amount, None),
    };
    if int_part.is_empty() || !int_part.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    let frac = frac_part.unwrap_or("");
    if frac_part.is_some() && frac.is_empty() {
        return Err(malformed());
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    let exp = currency.exponent();
    if frac.len() > exp as usize {
        return Err(MoneyError::TooManyDecimals { amount: amount.chars().take(32).collect(), currency, exponent: exp });
    }
    // Digits only from here: a part too long for i64 fails to parse, and a product or sum past it
    // is checked, so every too-large amount ends as TooLarge below.
    let int_trimmed = int_part.trim_start_matches('0');
    let whole: i64 = if int_trimmed.is_empty() { 0 } else { int_trimmed.parse().map_err(|_| MoneyError::TooLarge)? };
    let mut frac_minor: i64 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| malformed())? };
    for _ in frac.len()..exp as usize {
        frac_minor *= 10;
    }
    let minor =
        whole.checked_mul(10_i64.pow(exp)).and_then(|w| w.checked_add(frac_minor)).ok_or(MoneyError::TooLarge)?;
    if minor > AMOUNT_MINOR_MAX {
        return Err(MoneyError::TooLarge);
    }
    Ok(minor)
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.currency, self.to_decimal())
    }
}

/// Format a (possibly negative or zero) minor-unit amount as a canonical decimal string.
pub fn format_minor(minor: i64, currency: Currency) -> String {
    let exp = currency.exponent();
    let sign = if minor < 0 { "-" } else { "" };
    let abs = minor.unsigned_abs();
    if exp == 0 {
        return format!("{sign}{abs}");
    }
    let scale = 10_u64.pow(exp);
    format!("{sign}{}.{:0width$}", abs / scale, abs % scale, width = exp as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kes() -> Currency {
        Currency::parse("KES").unwrap()
    }

    #[test]
    fn parses_exactly_by_exponent() {
        assert_eq!(Money::parse("50.00", kes()).unwrap().minor(), 5000);
        assert_eq!(Money::parse("50.5", kes()).unwrap().minor(), 5050);
        assert_eq!(Money::parse("50", kes()).unwrap().minor(), 5000);
        assert_eq!(Money::parse("0.01", kes()).unwrap().minor(), 1);
        assert_eq!(Money::parse("007", Currency::parse("JPY").unwrap()).unwrap().minor(), 7);
        assert_eq!(Money::parse("1.234", Currency::parse("KWD").unwrap()).unwrap().minor(), 1234);
    }

    #[test]
    fn refuses_everything_that_is_not_a_plain_decimal() {
        for bad in ["", "-1", "+1", "1e3", "1.", ".5", " 1", "1 ", "1,000", "NaN", "0x10", "1.2.3", "١٢"] {
            assert!(Money::parse(bad, kes()).is_err(), "{bad:?} must be refused");
        }
        assert!(matches!(Money::parse("1.001", kes()), Err(MoneyError::TooManyDecimals { .. })));
        assert!(matches!(
            Money::parse("1.5", Currency::parse("JPY").unwrap()),
            Err(MoneyError::TooManyDecimals { .. })
        ));
        assert_eq!(Money::parse("0.00", kes()), Err(MoneyError::NotPositive));
        assert_eq!(Money::parse("99999999999999999999", kes()), Err(MoneyError::TooLarge));
        assert_eq!(Money::parse("10000000000000.01", kes()), Err(MoneyError::TooLarge));
    }

    /// No amount above `AMOUNT_MINOR_MAX` minor units, to the unit, whatever the exponent and
    /// however many digits (leading zeros do not count).
    #[test]
    fn amounts_are_bounded_to_the_unit() {
        let (jpy, kwd) = (Currency::parse("JPY").unwrap(), Currency::parse("KWD").unwrap());
        assert_eq!(parse_minor("1000000000000000", jpy), Ok(AMOUNT_MINOR_MAX));
        assert_eq!(parse_minor("0001000000000000000", jpy), Ok(AMOUNT_MINOR_MAX));
        assert_eq!(parse_minor("1000000000000001", jpy), Err(MoneyError::TooLarge));
        assert_eq!(parse_minor("1000000000000.000", kwd), Ok(AMOUNT_MINOR_MAX));
        assert_eq!(parse_minor("1000000000000.001", kwd), Err(MoneyError::TooLarge));
        for huge in ["99999999999999999", "9223372036854775807", "9223372036854775808", &"9".repeat(40)] {
            assert_eq!(parse_minor(huge, kes()), Err(MoneyError::TooLarge), "{huge}");
        }
        assert_eq!(Money::from_minor(AMOUNT_MINOR_MAX, kwd).map(|m| m.minor()), Ok(AMOUNT_MINOR_MAX));
        assert_eq!(Money::from_minor(AMOUNT_MINOR_MAX + 1, kwd), Err(MoneyError::TooLarge));
        assert_eq!(Money::from_minor(1, kes()).map(|m| m.minor()), Ok(1));
        assert_eq!(Money::from_minor(0, kes()), Err(MoneyError::NotPositive));
    }

    #[test]
    fn money_shows_its_currency_and_canonical_amount() {
        assert_eq!(Money::parse("50", kes()).unwrap().to_string(), "KES 50.00");
    }

    #[test]
    fn unknown_currency_is_refused() {
        assert!(Currency::parse("XXX").is_err());
        assert!(Currency::parse("kes").is_err());
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(format_minor(5000, kes()), "50.00");
        assert_eq!(format_minor(-5, kes()), "-0.05");
        assert_eq!(format_minor(0, kes()), "0.00");
        assert_eq!(format_minor(7, Currency::parse("JPY").unwrap()), "7");
    }
}

/// Amounts per currency in minor units, read from config as `{ KES = "1000.00" }`: each amount is
/// parsed exactly by its currency's exponent when the config loads, and never again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MoneyMap(std::collections::BTreeMap<Currency, i64>);

impl MoneyMap {
    pub fn get(&self, currency: Currency) -> Option<i64> {
        self.0.get(&currency).copied()
    }
    pub fn contains(&self, currency: Currency) -> bool {
        self.0.contains_key(&currency)
    }
    pub fn iter(&self) -> impl Iterator<Item = (Currency, i64)> + '_ {
        self.0.iter().map(|(c, m)| (*c, *m))
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Written back as it is read: currency code → decimal string in that currency's minor units.
impl serde::Serialize for MoneyMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (currency, minor) in &self.0 {
            map.serialize_entry(currency.code(), &format_minor(*minor, *currency))?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for MoneyMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = std::collections::BTreeMap::<String, String>::deserialize(d)?;
        let mut map = std::collections::BTreeMap::new();
        for (code, amount) in raw {
            let currency = Currency::parse(&code).map_err(serde::de::Error::custom)?;
            let minor = parse_minor(&amount, currency)
                .map_err(|e| serde::de::Error::custom(format!("{code} {amount:?}: {e}")))?;
            map.insert(currency, minor);
        }
        Ok(MoneyMap(map))
    }
}

#[cfg(test)]
mod money_map_tests {
    use super::*;

    /// Config amounts are parsed once, exactly, by their currency; a bad one names itself.
    #[test]
    fn a_money_map_reads_each_amount_by_its_currency() {
        let m: MoneyMap = serde_json::from_value(serde_json::json!({"KES": "1000.00", "JPY": "500"})).unwrap();
        let (kes, jpy, usd) =
            (Currency::parse("KES").unwrap(), Currency::parse("JPY").unwrap(), Currency::parse("USD").unwrap());
        assert_eq!((m.get(kes), m.get(jpy), m.get(usd)), (Some(100_000), Some(500), None));
        assert_eq!((m.contains(kes), m.contains(usd), m.is_empty()), (true, false, false));
        assert_eq!(m.iter().count(), 2);
        assert!(MoneyMap::default().is_empty());
        let bad = serde_json::from_value::<MoneyMap>(serde_json::json!({"KES": "10.001"})).unwrap_err();
        assert!(bad.to_string().contains("KES \"10.001\""), "{bad}");
        assert!(serde_json::from_value::<MoneyMap>(serde_json::json!({"XXX": "1"})).is_err());
    }
}
