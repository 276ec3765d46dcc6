//! The learning rate of each step: a linear warm-up from 0, then the peak held (`constant`) or
//! decayed to a floor by the last step (`linear`, `cosine`), the schedules long-context
//! fine-tuning recipes use. A pure function of the step, so a resumed run continues it exactly.

use serde::Serialize;

/// How the learning rate falls after the warm-up (`--decay`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// The peak rate from the end of the warm-up on.
    #[default]
    Constant,
    /// A straight line from the peak to the floor at the last step.
    Linear,
    /// Half a cosine from the peak to the floor at the last step.
    Cosine,
}

/// The learning rate over a run of `steps` steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    pub peak: f64,
    /// Where `linear` and `cosine` end (`--min-lr`).
    pub floor: f64,
    pub warmup: u64,
    pub decay: Decay,
    pub steps: u64,
}

impl LrSchedule {
    /// The rate of step `step` (1-based).
    pub fn at(&self, step: u64) -> f64 {
        if step <= self.warmup {
            return self.peak * step as f64 / self.warmup.max(1) as f64;
        }
        let span = self.steps.saturating_sub(self.warmup);
        if span == 0 {
            return self.peak;
        }
        let done = (step - self.warmup).min(span) as f64 / span as f64;
        let kept = match self.decay {
            Decay::Constant => return self.peak,
            Decay::Linear => 1.0 - done,
            Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * done).cos()),
        };
        self.floor + (self.peak - self.floor) * kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(decay: Decay) -> LrSchedule {
        LrSchedule {
            peak: 1e-3,
            floor: 1e-4,
            warmup: 10,
            decay,
            steps: 110,
        }
    }

    #[test]
    fn warm_up_then_hold_or_decay_to_the_floor() {
        for decay in [Decay::Constant, Decay::Linear, Decay::Cosine] {
            let s = schedule(decay);
            assert_eq!(s.at(5), 5e-4, "{decay:?}: half way up the warm-up");
            assert_eq!(s.at(10), 1e-3, "{decay:?}: the peak at its end");
        }
        assert_eq!(schedule(Decay::Constant).at(110), 1e-3);
        for decay in [Decay::Linear, Decay::Cosine] {
            let s = schedule(decay);
            assert!(
                (s.at(110) - 1e-4).abs() < 1e-15,
                "{decay:?} ends on the floor"
            );
            assert!(
                (s.at(60) - 5.5e-4).abs() < 1e-15,
                "{decay:?}: midway between"
            );
            let rates: Vec<f64> = (10..=110).map(|t| s.at(t)).collect();
            assert!(rates.windows(2).all(|w| w[1] <= w[0]), "{decay:?} falls");
        }
        // A quarter of the way down: linear has lost a quarter, cosine (1 - cos(π/4))/2 of it.
        let (lin, cos) = (
            schedule(Decay::Linear).at(35),
            schedule(Decay::Cosine).at(35),
        );
        assert!((lin - (1e-4 + 9e-4 * 0.75)).abs() < 1e-15);
        let kept = 0.5 * (1.0 + std::f64::consts::FRAC_1_SQRT_2);
        assert!((cos - (1e-4 + 9e-4 * kept)).abs() < 1e-15);
        assert_eq!(
            schedule(Decay::Cosine).at(500),
            schedule(Decay::Cosine).at(110)
        );
    }
}
