//! Text an agent writes that a person reads: memos, refund reasons, remarks, account references,
//! descriptions. One rule for all of it: what a person sees is what the record holds, so characters
//! that are not shown as themselves are refused — control characters (Cc), the bidirectional
//! overrides, embeddings and isolates that reorder what follows ("Trojan source", CVE-2021-42574),
//! the zero-width and invisible formatting characters that hide or join text, the byte-order mark
//! and the tag characters that smuggle invisible ASCII to a model. Escaping does not neutralise a
//! bidi control in every viewer; refusing it does. A refusal names the code point.

/// Whether `c` is not shown as itself: a control character or an invisible formatting character
/// that reorders, hides or joins text.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'                    // soft hyphen
            | '\u{034F}'                  // combining grapheme joiner
            | '\u{061C}'                  // Arabic letter mark (a bidi mark)
            | '\u{115F}' | '\u{1160}'     // Hangul fillers (render as nothing)
            | '\u{17B4}' | '\u{17B5}'     // Khmer inherent vowels (invisible)
            | '\u{180B}'..='\u{180F}'     // Mongolian free variation selectors and vowel separator
            | '\u{200B}'..='\u{200F}'     // zero-width space, non-joiner, joiner; LRM, RLM
            | '\u{2028}' | '\u{2029}'     // line and paragraph separators
            | '\u{202A}'..='\u{202E}'     // bidi embeddings and overrides (LRE RLE PDF LRO RLO)
            | '\u{2060}'..='\u{206F}'     // word joiner, invisible operators, bidi isolates, deprecated format
            | '\u{3164}'                  // Hangul filler
            | '\u{FE00}'..='\u{FE0F}'     // variation selectors
            | '\u{FEFF}'                  // byte-order mark / zero-width no-break space
            | '\u{FFA0}'                  // halfwidth Hangul filler
            | '\u{FFF9}'..='\u{FFFB}'     // interlinear annotation controls
            | '\u{1D173}'..='\u{1D17A}'   // musical symbol format controls
            | '\u{E0000}'..='\u{E007F}'   // tag characters (invisible ASCII)
            | '\u{E0100}'..='\u{E01EF}' // variation selectors supplement
        )
}

/// The first character of `s` that is not shown as itself, as `U+XXXX`.
pub fn first_hidden(s: &str) -> Option<String> {
    s.chars().find(|c| is_hidden(*c)).map(|c| format!("U+{:04X}", u32::from(c)))
}

/// Why `s` is refused as text a person reads, after the field's name ("memo must not …"), or
/// `None` when every character shows as itself.
pub fn refusal(s: &str) -> Option<String> {
    first_hidden(s)
        .map(|cp| format!("must not contain control, bidirectional or invisible formatting characters (found {cp})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trojan_source_and_invisible_text_are_refused() {
        for c in [
            '\u{0}',
            '\n',
            '\u{7f}',
            '\u{9b}',
            '\u{202E}',
            '\u{202C}',
            '\u{202A}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{200E}',
            '\u{200F}',
            '\u{FEFF}',
            '\u{061C}',
            '\u{2060}',
            '\u{E0041}',
            '\u{E007F}',
            '\u{00AD}',
            '\u{2028}',
        ] {
            let s = format!("pay SUPPLIER{c}-001");
            assert!(refusal(&s).is_some(), "U+{:04X} passed", u32::from(c));
        }
        assert_eq!(first_hidden("a\u{202E}b").as_deref(), Some("U+202E"));
        assert_eq!(first_hidden("x\u{E0041}").as_deref(), Some("U+E0041"));
    }

    #[test]
    fn ordinary_text_in_any_script_passes() {
        for s in
            ["Invoice 42 — March", "Malipo ya bidhaa", "رسوم الخدمة", "電気代 3月分", "café €12,50", "INV-1/2026 #7"]
        {
            assert_eq!(refusal(s), None, "{s}");
        }
    }
}
