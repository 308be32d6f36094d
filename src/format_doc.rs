//! Tests only: reads the byte-by-byte examples of `docs/format.md`, so each format's test checks the document
//! against the code (the document is the contract outside checkers read).

/// The hex bytes of the `n`th example block (0-based) of the section titled `## {section}`: lines of the form
/// `OFFSET: hex hex ...   note`, the note (after three spaces) ignored.
pub fn example(section: &str, n: usize) -> Vec<u8> {
    let doc = include_str!("../docs/format.md");
    let title = format!("## {section}");
    let at = doc
        .find(&title)
        .unwrap_or_else(|| panic!("docs/format.md has no {title:?} section"));
    let block = doc[at..]
        .split("```")
        .nth(2 * n + 1)
        .unwrap_or_else(|| panic!("{title:?} has no example block {n}"));
    block
        .lines()
        .filter_map(|l| l.split_once(": "))
        .flat_map(|(_, rest)| {
            rest.split("   ")
                .next()
                .unwrap_or("")
                .split_whitespace()
                .map(|h| u8::from_str_radix(h, 16).expect("hex"))
                .collect::<Vec<_>>()
        })
        .collect()
}
