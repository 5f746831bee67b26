//! Tokenized documents as rows of the sequence length, as MaxText packs them.
//!
//! Each document `t1 .. tn` is read as `EOS t1 .. tn EOS`, and gives `n + 1` (input, target)
//! pairs: `EOS -> t1`, ..., `tn -> EOS`, so no target crosses a document boundary. A
//! document longer than a row is cut into pieces of a row each. With packing, pieces are
//! put one after the other into a row while they fit (else the row is closed and a new one
//! starts), each with its own segment id (1, 2, ... within the row) and positions counting
//! from 0; without, each piece has a row of its own. The rest of a row is padding: segment
//! id 0, and target -1 (no target: the loss leaves it out).

/// `rows` rows of `seq` positions, row-major.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rows {
    pub seq: usize,
    pub tokens: Vec<i32>,
    /// The next token, or -1 where there is none (padding).
    pub targets: Vec<i32>,
    /// Position within the document piece (RoPE's position).
    pub positions: Vec<i32>,
    /// The document piece's id within its row (from 1), 0 for padding.
    pub segment_ids: Vec<i32>,
}

impl Rows {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.tokens.len().checked_div(self.seq).unwrap_or(0)
    }

    /// Whether there is no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions with a target.
    pub fn real_targets(&self) -> usize {
        self.targets.iter().filter(|&&t| t >= 0).count()
    }

    fn push_padding_to(&mut self, end: usize) {
        let n = end - self.tokens.len();
        self.tokens.extend(std::iter::repeat_n(0, n));
        self.targets.extend(std::iter::repeat_n(-1, n));
        self.positions.extend(std::iter::repeat_n(0, n));
        self.segment_ids.extend(std::iter::repeat_n(0, n));
    }
}

/// `docs` (token ids) in rows of `seq` positions, packed or one piece a row (see the module
/// docs); `eos` the end-of-text token.
pub fn pack(docs: &[Vec<u32>], eos: u32, seq: usize, packing: bool) -> Rows {
    let mut rows = Rows {
        seq,
        ..Rows::default()
    };
    if seq == 0 {
        return rows;
    }
    // Where the current row started and its next segment id.
    let mut row_start = 0;
    let mut segment = 0;
    for doc in docs {
        let stream: Vec<i32> = std::iter::once(eos)
            .chain(doc.iter().copied())
            .chain(std::iter::once(eos))
            .map(|t| t as i32)
            .collect();
        let pairs = stream.len() - 1;
        let mut at = 0;
        while at < pairs {
            let len = (pairs - at).min(seq);
            let used = rows.tokens.len() - row_start;
            let fits = segment > 0 && packing && used + len <= seq;
            if !fits {
                if segment > 0 {
                    rows.push_padding_to(row_start + seq);
                }
                row_start = rows.tokens.len();
                segment = 0;
            }
            segment += 1;
            for i in 0..len {
                rows.tokens.push(stream[at + i]);
                rows.targets.push(stream[at + i + 1]);
                rows.positions.push(i as i32);
                rows.segment_ids.push(segment);
            }
            at += len;
        }
    }
    if segment > 0 {
        rows.push_padding_to(row_start + seq);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_documents_with_segments_and_masks() {
        let docs = vec![vec![5, 6], vec![7], vec![8, 9, 10, 11, 12, 13, 14]];
        let packed = pack(&docs, 1, 6, true);
        // Row 0: [1 5 6 | 1 7 | pad]; the long document (8 pairs) fills row 1 and part of 2.
        assert_eq!(packed.len(), 3);
        assert_eq!(&packed.tokens[..6], &[1, 5, 6, 1, 7, 0]);
        assert_eq!(&packed.targets[..6], &[5, 6, 1, 7, 1, -1]);
        assert_eq!(&packed.segment_ids[..6], &[1, 1, 1, 2, 2, 0]);
        assert_eq!(&packed.positions[..6], &[0, 1, 2, 0, 1, 0]);
        assert_eq!(&packed.tokens[6..12], &[1, 8, 9, 10, 11, 12]);
        assert_eq!(&packed.targets[12..18], &[14, 1, -1, -1, -1, -1]);
        assert_eq!(packed.real_targets(), 3 + 2 + 8);
        let unpacked = pack(&docs, 1, 6, false);
        assert_eq!(unpacked.len(), 4);
        assert_eq!(unpacked.real_targets(), packed.real_targets());
        assert_eq!(&unpacked.segment_ids[..6], &[1, 1, 1, 0, 0, 0]);
    }
}
