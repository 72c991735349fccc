//! `settle.Budget`: the limits of a session and every session under it.

use std::time::Duration;

use pyo3::prelude::*;
use settle_core::Budget;

use crate::args::Whole;
use crate::errors;

/// What a session and its whole subtree may spend: `turns` (the most turns
/// they start), `tokens` (the most tokens their turns' usage reports
/// count), `wall_time` (the longest, in seconds, from its registration).
/// Exceeding one cancels the subtree, children first (G1), and finalizes
/// each of its sessions `budget_exhausted`; the turn that would go past
/// `turns` is refused with `settle.BudgetExhausted`. `None` limits nothing.
#[pyclass(name = "Budget", module = "settle", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyBudget {
    budget: Budget,
}

impl PyBudget {
    /// The kernel's budget.
    pub fn get(&self) -> Budget {
        self.budget
    }
}

#[pymethods]
impl PyBudget {
    #[new]
    #[pyo3(signature = (*, turns = None, tokens = None, wall_time = None))]
    fn new(
        turns: Option<Whole<u32>>,
        tokens: Option<Whole<u64>>,
        wall_time: Option<f64>,
    ) -> PyResult<Self> {
        let (turns, tokens) = (turns.map(|t| t.0), tokens.map(|t| t.0));
        let mut budget = Budget::default();
        if let Some(turns) = turns {
            budget = budget.turns(turns);
        }
        if let Some(tokens) = tokens {
            budget = budget.tokens(tokens);
        }
        if let Some(wall) = wall_time {
            let wall = Duration::try_from_secs_f64(wall).map_err(|_| {
                errors::BadInput::new_err(format!(
                    "wall_time must be a number of seconds ≥ 0, not {wall}"
                ))
            })?;
            budget = budget.wall_time(wall);
        }
        Ok(PyBudget { budget })
    }

    /// The most turns, if limited.
    #[getter]
    fn turns(&self) -> Option<u32> {
        self.budget.max_turns
    }

    /// The most tokens, if limited.
    #[getter]
    fn tokens(&self) -> Option<u64> {
        self.budget.max_tokens
    }

    /// The longest wall time in seconds, if limited.
    #[getter]
    fn wall_time(&self) -> Option<f64> {
        self.budget.max_wall.map(|wall| wall.as_secs_f64())
    }

    fn __repr__(&self) -> String {
        let show = |v: Option<String>| v.unwrap_or_else(|| "None".into());
        format!(
            "settle.Budget(turns={}, tokens={}, wall_time={})",
            show(self.turns().map(|t| t.to_string())),
            show(self.tokens().map(|t| t.to_string())),
            show(self.wall_time().map(|t| t.to_string())),
        )
    }
}
