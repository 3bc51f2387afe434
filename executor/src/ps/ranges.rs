//! A PS shard's ranges as the planner's shard map gives them: how many
//! values they hold ([`shard_len`]), where the buffer values begin
//! ([`buffer_offset`]: buffer ranges follow all parameter ranges), and
//! what can be wrong with a map of them ([`ShardMapError`]), which no
//! generation can serve.

use trainyard_common::cluster::Range;

/// Elements of a shard's ranges.
pub fn shard_len(ranges: &[Range]) -> usize {
    ranges.iter().map(|r| (r.end - r.start) as usize).sum()
}

/// Why a shard map (the planner's ranges, or a worker's view of them over
/// its model) cannot be served: no generation can, and the job fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardMapError {
    /// A buffer range precedes a parameter range of the same shard.
    #[error("ranges[{at}] ({}) is a buffer range before the parameter range ranges[{param_at}] ({}): a shard's buffer ranges must follow all of its parameter ranges", span(.buffer), span(.param))]
    BufferFirst {
        /// Its index.
        at: usize,
        /// The buffer range.
        buffer: Range,
        /// The parameter range's index.
        param_at: usize,
        /// The parameter range.
        param: Range,
    },
    /// A range of a tensor the model does not have.
    #[error("shard {shard} holds a range of {param:?}, which this model does not have")]
    Unknown {
        /// The shard.
        shard: u32,
        /// The tensor it names.
        param: String,
    },
    /// A range past its tensor's end, or empty.
    #[error("shard {shard} holds {} but the tensor has {len} values", span(.range))]
    OutOfBounds {
        /// The shard.
        shard: u32,
        /// The range.
        range: Range,
        /// The tensor's values.
        len: usize,
    },
    /// A buffer range over a trainable tensor, or the other way round.
    #[error("shard {shard} holds {} as a {}, but this model's {} is a {}", span(.range), held_as(.range), .range.param, is_a(.range))]
    WrongKind {
        /// The shard.
        shard: u32,
        /// The range.
        range: Range,
    },
    /// The ranges do not cover the model exactly.
    #[error("the shards hold {covered} values but the model has {numel}")]
    Uncovered {
        /// Values the ranges hold.
        covered: usize,
        /// Values the model has.
        numel: usize,
    },
}

/// `NAME[START..END]`.
fn span(r: &Range) -> String {
    format!("{}[{}..{}]", r.param, r.start, r.end)
}

fn held_as(r: &Range) -> &'static str {
    if r.buffer {
        "buffer"
    } else {
        "parameter"
    }
}

fn is_a(r: &Range) -> &'static str {
    if r.buffer {
        "trainable parameter"
    } else {
        "buffer"
    }
}

/// Where a shard's buffer values begin: the elements of its parameter
/// ranges, which must all come before its buffer ranges (the planner's
/// shard map does so); an error naming the first buffer range that
/// precedes a parameter range.
pub fn buffer_offset(ranges: &[Range]) -> Result<usize, ShardMapError> {
    let head = ranges.iter().take_while(|r| !r.buffer).count();
    if let Some(i) = ranges[head..].iter().position(|r| !r.buffer) {
        return Err(ShardMapError::BufferFirst {
            at: head,
            buffer: ranges[head].clone(),
            param_at: head + i,
            param: ranges[head + i].clone(),
        });
    }
    Ok(shard_len(&ranges[..head]))
}
