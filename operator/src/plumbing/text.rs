//! Text kept in statuses and messages (pure).

/// The start of `text`, at most `max` bytes, cut at a character boundary: what a status keeps of a
/// message that may be long (a group's status of many trajectories must stay far below the API
/// server's object size limit).
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn text_is_cut_at_a_character_boundary_never_inside_one() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("abcdef", 3), "abc");
        assert_eq!(cut("éé", 3), "é", "never half a character");
        assert_eq!(cut("", 0), "");
    }
}
