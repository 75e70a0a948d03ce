//! LCS: the longest common subsequence of two strings, computed as Redis computes it (the
//! same dynamic programme and the same walk back), so the string, its length and the
//! matched ranges (`IDX`) are Redis' own, ranges listed from the end of the strings.

/// One run of the subsequence that is contiguous in both strings: inclusive byte ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    pub a: (usize, usize),
    pub b: (usize, usize),
}

impl Match {
    pub fn length(&self) -> usize {
        self.a.1 - self.a.0 + 1
    }
}

/// Cells of the table above which LCS refuses (Redis only bounds it by memory): 2^28 cells of
/// 4 bytes is 1 GiB.
pub const CELLS_MAX: usize = 1 << 28;

/// The subsequence and its contiguous runs (every run, before any MINMATCHLEN filter), or
/// `None` if the table would exceed [`CELLS_MAX`].
pub fn lcs(a: &[u8], b: &[u8]) -> Option<(Vec<u8>, Vec<Match>)> {
    let width = b.len() + 1;
    let cells = (a.len() + 1).checked_mul(width).filter(|cells| *cells <= CELLS_MAX)?;
    let mut table = vec![0u32; cells];
    let at = |i: usize, j: usize| i * width + j;
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            table[at(i, j)] = if a[i - 1] == b[j - 1] {
                table[at(i - 1, j - 1)] + 1
            } else {
                table[at(i - 1, j)].max(table[at(i, j - 1)])
            };
        }
    }
    let mut length = table[at(a.len(), b.len())] as usize;
    let mut result = vec![0u8; length];
    let mut matches = Vec::new();
    // `current`: the run being extended backwards, if any.
    let mut current: Option<Match> = None;
    let (mut i, mut j) = (a.len(), b.len());
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            result[length - 1] = a[i - 1];
            match &mut current {
                None => current = Some(Match { a: (i - 1, i - 1), b: (j - 1, j - 1) }),
                Some(run) if run.a.0 == i && run.b.0 == j => {
                    run.a.0 -= 1;
                    run.b.0 -= 1;
                }
                // Redis drops this byte from the ranges (it is in the string all the same).
                Some(_) => emit = true,
            }
            if current.is_some_and(|run| run.a.0 == 0 || run.b.0 == 0) {
                emit = true;
            }
            length -= 1;
            i -= 1;
            j -= 1;
        } else {
            if table[at(i - 1, j)] > table[at(i, j - 1)] {
                i -= 1;
            } else {
                j -= 1;
            }
            emit = emit || current.is_some();
        }
        if emit {
            matches.extend(current.take());
        }
    }
    Some((result, matches))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_redis_on_its_documented_example() {
        let (string, matches) = lcs(b"ohmytext", b"mynewtext").expect("small");
        assert_eq!(string, b"mytext");
        assert_eq!(matches, [Match { a: (4, 7), b: (5, 8) }, Match { a: (2, 3), b: (0, 1) }]);
        assert_eq!(lcs(b"", b"abc").expect("small"), (Vec::new(), Vec::new()));
    }
}
