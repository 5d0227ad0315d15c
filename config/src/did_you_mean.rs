//! "Did you mean": the known name closest to a misspelled one.

/// How alike (Jaro-Winkler) a known name must be to a misspelled one to be suggested.
const SIMILARITY: f64 = 0.8;

/// The candidate most like `word`, if any is alike enough to be what was meant.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|known| (strsim::jaro_winkler(word, known), known))
        .filter(|(similarity, _)| *similarity >= SIMILARITY)
        .max_by(|(a, _), (b, _)| a.total_cmp(b))
        .map(|(_, known)| known)
}

#[cfg(test)]
mod tests {
    use super::did_you_mean;

    #[test]
    fn the_closest_alike_name_is_suggested() {
        let pools = ["default", "gpu-a100", "cpu"];
        assert_eq!(did_you_mean("gpu-a10", pools), Some("gpu-a100"));
        assert_eq!(did_you_mean("defualt", pools), Some("default"));
        assert_eq!(did_you_mean("batch", pools), None);
    }
}
