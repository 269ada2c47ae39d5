//! A linearizability checker for small histories (Wing and Gong's search, with Lowe's
//! memo of what was tried): is there one order of the operations, each placed between
//! its call and its return, in which every result is what a sequential model answers?
//!
//! An operation whose outcome the client never learnt (a write cut off by a killed
//! server) has no return: it may take effect at any point after its call, or never
//! (placing it last, where nothing observes it, is the same as never).

use std::collections::HashSet;
use std::hash::Hash;

/// What the operations act on, one step at a time.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Input;
    type Output;

    /// The states `input` may leave behind when applied to `state` and answered
    /// `output` (`None`: the answer is unknown); empty when that answer is impossible.
    fn step(state: &Self::State, input: &Self::Input, output: Option<&Self::Output>) -> Vec<Self::State>;
}

/// One operation as a client saw it: times are any clock shared by every client.
#[derive(Clone, Debug)]
pub struct Op<I, O> {
    pub call: u64,
    /// `None`: the client never learnt whether, or how, it ended.
    pub ret: Option<u64>,
    pub input: I,
    pub output: Option<O>,
}

/// Why a history was not found linearizable.
#[derive(Debug)]
pub enum Verdict {
    Linearizable,
    /// No order exists; the longest prefix any order reached, by operation index.
    Violation {
        longest: Vec<usize>,
    },
    /// The search took more than its budget of steps: neither proven nor refuted.
    TooLong,
}

/// Searches for a linearization of `history` from `initial`, taking at most `budget`
/// steps.
pub fn check<M: Model>(initial: M::State, history: &[Op<M::Input, M::Output>], budget: usize) -> Verdict {
    let n = history.len();
    // Calls in time order, so the candidates for the next place are a prefix of them.
    let mut by_call: Vec<usize> = (0..n).collect();
    by_call.sort_by_key(|&i| history[i].call);
    let ret = |i: usize| history[i].ret.unwrap_or(u64::MAX);
    let words = n.div_ceil(64);

    let mut seen: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    // Each placement: the one before it, and the operation placed.
    let mut placements: Vec<(usize, usize)> = Vec::new();
    let order_of = |placements: &[(usize, usize)], mut at: usize| {
        let mut order = Vec::new();
        while at != usize::MAX {
            order.push(placements[at].1);
            at = placements[at].0;
        }
        order.reverse();
        order
    };
    // Depth-first: each entry is a set of placed operations, how many, the last
    // placement and the state they leave.
    let mut stack: Vec<(Vec<u64>, usize, usize, M::State)> = vec![(vec![0; words], 0, usize::MAX, initial)];
    let (mut deepest, mut deepest_at) = (0, usize::MAX);
    let mut steps = 0;
    while let Some((placed, depth, at, state)) = stack.pop() {
        if depth == n {
            return Verdict::Linearizable;
        }
        if depth > deepest {
            (deepest, deepest_at) = (depth, at);
        }
        steps += 1;
        if steps > budget {
            return Verdict::TooLong;
        }
        let is_placed = |i: usize| placed[i / 64] & (1 << (i % 64)) != 0;
        // An operation may go next only if none still unplaced returned before its call.
        let earliest_return = (0..n).filter(|&i| !is_placed(i)).map(ret).min().unwrap_or(u64::MAX);
        for &i in by_call.iter().take_while(|&&i| history[i].call <= earliest_return) {
            if is_placed(i) {
                continue;
            }
            for next in M::step(&state, &history[i].input, history[i].output.as_ref()) {
                let mut placed = placed.clone();
                placed[i / 64] |= 1 << (i % 64);
                if seen.insert((placed.clone(), next.clone())) {
                    placements.push((at, i));
                    stack.push((placed, depth + 1, placements.len() - 1, next));
                }
            }
        }
    }
    let longest = if deepest_at == usize::MAX { Vec::new() } else { order_of(&placements, deepest_at) };
    Verdict::Violation { longest }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One register: write a value, read it, or compare-and-set it.
    struct Register;

    #[derive(Debug)]
    enum In {
        Write(u32),
        Read,
        Cas(u32, u32),
    }

    #[derive(Debug)]
    enum Out {
        Done,
        Value(u32),
        Swapped(bool),
    }

    impl Model for Register {
        type State = u32;
        type Input = In;
        type Output = Out;

        fn step(state: &u32, input: &In, output: Option<&Out>) -> Vec<u32> {
            match (input, output) {
                (In::Write(v), _) => vec![*v],
                (In::Read, Some(Out::Value(v))) if v == state => vec![*state],
                (In::Read, None) => vec![*state],
                (In::Cas(from, to), Some(Out::Swapped(true))) if from == state => vec![*to],
                (In::Cas(from, _), Some(Out::Swapped(false))) if from != state => vec![*state],
                (In::Cas(from, to), None) if from == state => vec![*to, *state],
                (In::Cas(..), None) => vec![*state],
                _ => vec![],
            }
        }
    }

    fn op(call: u64, ret: Option<u64>, input: In, output: Option<Out>) -> Op<In, Out> {
        Op { call, ret, input, output }
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order() {
        // The read overlaps the write: it may see 0 or 1.
        for seen in [0, 1] {
            let history = [
                op(0, Some(10), In::Write(1), Some(Out::Done)),
                op(5, Some(15), In::Read, Some(Out::Value(seen))),
            ];
            assert!(matches!(check::<Register>(0, &history, 1000), Verdict::Linearizable));
        }
    }

    #[test]
    fn a_read_after_a_write_returned_that_misses_it_is_a_violation() {
        let history =
            [op(0, Some(10), In::Write(1), Some(Out::Done)), op(11, Some(15), In::Read, Some(Out::Value(0)))];
        assert!(matches!(check::<Register>(0, &history, 1000), Verdict::Violation { .. }));
    }

    #[test]
    fn a_write_with_no_answer_may_have_happened_or_not() {
        for seen in [0, 7] {
            let history = [
                op(0, None, In::Write(7), None),
                op(20, Some(30), In::Read, Some(Out::Value(seen))),
                op(40, Some(50), In::Read, Some(Out::Value(seen))),
            ];
            assert!(matches!(check::<Register>(0, &history, 1000), Verdict::Linearizable));
        }
        // But once seen it cannot be unseen.
        let history = [
            op(0, None, In::Write(7), None),
            op(20, Some(30), In::Read, Some(Out::Value(7))),
            op(40, Some(50), In::Read, Some(Out::Value(0))),
        ];
        assert!(matches!(check::<Register>(0, &history, 1000), Verdict::Violation { .. }));
    }

    #[test]
    fn two_compare_and_sets_from_one_value_cannot_both_win() {
        let history = [
            op(0, Some(10), In::Cas(0, 1), Some(Out::Swapped(true))),
            op(0, Some(10), In::Cas(0, 2), Some(Out::Swapped(true))),
        ];
        assert!(matches!(check::<Register>(0, &history, 1000), Verdict::Violation { .. }));
        let history = [
            op(0, Some(10), In::Cas(0, 1), Some(Out::Swapped(true))),
            op(0, Some(10), In::Cas(0, 2), Some(Out::Swapped(false))),
            op(11, Some(12), In::Read, Some(Out::Value(1))),
        ];
        assert!(matches!(check::<Register>(0, &history, 1000), Verdict::Linearizable));
    }

    #[test]
    fn many_concurrent_clients_are_checked_within_the_budget() {
        // Eight clients, each writing its own values and reading back the last value
        // written before its read began.
        let mut history = Vec::new();
        let mut t = 0;
        for round in 0..60u32 {
            for client in 0..8u32 {
                history.push(op(
                    t + u64::from(client),
                    Some(t + 20),
                    In::Write(round * 8 + client),
                    Some(Out::Done),
                ));
            }
            t += 30;
            history.push(op(t, Some(t + 5), In::Read, Some(Out::Value(round * 8 + 7))));
            t += 10;
        }
        // Any of the eight concurrent writes may land last, but the read saw client 7's.
        assert!(matches!(check::<Register>(0, &history, 1_000_000), Verdict::Linearizable));
    }
}
