//! The composable GQA and MLA pieces (`gqa_scores`, `gqa_value_product`, `mla_absorb_query`,
//! `mla_scores`, `mla_value_product`): one strided batched dot-product kernel ([`kernel`]) behind
//! the entry points ([`api`]).

pub mod api;
pub mod kernel;

use crate::blocks::FLOAT_DTYPES;
use crate::family::Family;
use crate::problem::Case;
use crate::registry::Registered;
use kernel::attention_pieces_dot;

/// The pieces' dot-product kernel for every operand/output dtype combination they launch
/// (family `attention_pieces`).
pub struct AttentionPieces;

impl Family for AttentionPieces {
    fn names(&self) -> &'static [&'static str] {
        &["attention_pieces"]
    }

    fn configs(&self) -> Vec<Registered> {
        FLOAT_DTYPES
            .into_iter()
            .flat_map(api::piece_configs)
            .map(|cfg| Registered::new(cfg.id(), "attention_pieces", Some(cfg.a), move || attention_pieces_dot(&cfg)))
            .collect()
    }

    fn sample(&self, _: &str, id: &str) -> Option<Case> {
        // mla_scores-shaped: 3 heads, 5 tokens, 37 keys, rank 64, positional dim 16.
        let mut c = Case::new([1, 5, 3]);
        c.scalars.extend([("n", 37), ("k", 64), ("ga", 1), ("gb", 1)]);
        c.scalars.extend([("a_batch", 64), ("a_row", 192), ("a_k", 1), ("b_batch", 0), ("b_col", 64), ("b_k", 1)]);
        c.scalars.extend([("o_batch", 185), ("o_row", 37), ("o_col", 1)]);
        if id.ends_with(".two") {
            c.scalars.extend([("k2", 16), ("a2_batch", 16), ("a2_row", 48), ("a2_k", 1)]);
            c.scalars.extend([("b2_batch", 0), ("b2_col", 16), ("b2_k", 1)]);
        }
        Some(c)
    }
}
