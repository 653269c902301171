//! Text as it must be written into a Markdown table cell.

/// `text` on one line, safe in a table cell: pipes escaped, and `<` and `>`
/// outside code spans written as entities, so that help such as
/// "`<root>/<namespace>`" or "at most <N>" is not read as HTML.
pub(crate) fn cell(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(one_line.len());
    for (i, part) in one_line.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        let in_code = i % 2 == 1;
        for c in part.chars() {
            match c {
                '|' => out.push_str("\\|"),
                '<' if !in_code => out.push_str("&lt;"),
                '>' if !in_code => out.push_str("&gt;"),
                c => out.push(c),
            }
        }
    }
    out
}

/// `text` as a code span, long enough a fence for any backticks inside.
pub(crate) fn code(text: &str) -> String {
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_one_line_with_its_pipes_escaped() {
        assert_eq!(cell("a\n  b | c"), "a b \\| c");
    }

    #[test]
    fn angle_brackets_are_entities_outside_code_only() {
        assert_eq!(
            cell("under <root> and `<root>/<ns>`"),
            "under &lt;root&gt; and `<root>/<ns>`"
        );
    }
}
