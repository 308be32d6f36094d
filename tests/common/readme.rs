//! The Markdown examples' runner's parts, shared by `tests/readme.rs` (the single-server blocks) and
//! `tests/cluster.rs` (the cluster blocks): the blocks of a Markdown file, and the HTTP statuses a run printed
//! against the ones its comments show.

/// The blocks of a Markdown file fenced as ```` ```{info} ```` (exactly: ```` ```sh ```` is not ```` ```sh cluster ````), in
/// order.
pub fn fenced_blocks(markdown: &str, info: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_end().strip_prefix("```") == Some(info) => current = Some(Vec::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.push(current.take().unwrap().join("\n")),
            Some(lines) => lines.push(line),
        }
    }
    assert!(current.is_none(), "an unclosed ```{info} block");
    blocks
}

/// HTTP statuses in `text`, in order: `HTTP/1.1 NNN` status lines, and a three-digit code alone on a line or after
/// a JSON reply (what `curl -w '%{http_code}'` prints), with any words after it.
pub fn statuses(text: &str) -> Vec<u16> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        // A JSON reply ends without a newline, so a status line may follow it on the same line.
        if let Some(at) = line.find("HTTP/1.1 ") {
            if let Some(code) = line[at + 9..].get(..3).and_then(|c| c.parse().ok()) {
                out.push(code);
            }
            continue;
        }
        // A JSON reply followed by a code (`{...} 410`), or a code alone (` 200`, `204`).
        let rest = if line.starts_with('{') || line.starts_with('[') {
            match line.rfind(['}', ']']) {
                Some(end) => line[end + 1..].trim_start(),
                None => continue,
            }
        } else {
            line
        };
        let code = rest.split_whitespace().next().unwrap_or("");
        if code.len() == 3
            && code.bytes().all(|b| b.is_ascii_digit())
            && (b'1'..=b'5').contains(&code.as_bytes()[0])
        {
            out.push(code.parse().unwrap());
        }
    }
    out
}

/// The comments of a block (what it printed when it was written), without their `# `.
pub fn expected(block: &str) -> String {
    block
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}
