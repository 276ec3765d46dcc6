//! The loss curve as an SVG picture: people would rather look at it than read numbers. Both axes
//! carry tick values; the loss axis is logarithmic when the loss spans a decade or more (a
//! falling loss is then readable at its end, not only at its start); steps whose loss was not a
//! number or infinite are marked and counted, so a run that diverged says so on the picture.

use std::fmt::Write;

const W: f64 = 640.0;
const H: f64 = 360.0;
const PAD: f64 = 60.0;

/// About this many ticks an axis.
const TICKS: usize = 6;

/// A linear or logarithmic map of values onto a pixel range, from tick to tick.
struct Axis {
    lo: f64,
    hi: f64,
    /// Between ticks: a power of ten times 1, 2 or 5 (linear), one decade (log).
    step: f64,
    log: bool,
}

impl Axis {
    /// A logarithmic axis from `lo` to `hi` (both positive), widened to whole decades.
    fn log(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = (lo.log10().floor(), hi.log10().ceil());
        Axis {
            lo,
            hi: hi.max(lo + 1.0),
            step: 1.0,
            log: true,
        }
    }

    /// A linear axis from `lo` to `hi`, widened to whole ticks at least `min_step` apart (1 for
    /// steps, which are whole numbers).
    fn linear(lo: f64, hi: f64, min_step: f64) -> Axis {
        let (lo, hi) = if hi - lo < 1e-12 {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo, hi)
        };
        let raw = (hi - lo) / TICKS as f64;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * magnitude)
            .max(min_step);
        Axis {
            lo: (lo / step).floor() * step,
            hi: (hi / step).ceil() * step,
            step,
            log: false,
        }
    }

    /// Where `value` falls between 0 (at `lo`) and 1 (at `hi`).
    fn fraction(&self, value: f64) -> f64 {
        let v = if self.log { value.log10() } else { value };
        (v - self.lo) / (self.hi - self.lo)
    }

    /// The values to label: powers of ten on a log axis, round numbers on a linear one.
    fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round() as i64;
        (0..=n)
            .map(|i| self.lo + i as f64 * self.step)
            .map(|v| if self.log { 10f64.powf(v) } else { v })
            .collect()
    }
}

/// A tick's label: short, and exact for the round numbers ticks are.
fn label(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        format!("{v:.0e}")
    } else {
        format!("{}", (v * 1e6).round() / 1e6)
    }
}

/// A line plot of `loss` against step, with tick values on both axes.
pub fn loss_curve(title: &str, steps: &[u64], loss: &[f64]) -> String {
    let points: Vec<(f64, f64)> = steps
        .iter()
        .map(|&s| s as f64)
        .zip(loss.iter().copied())
        .collect();
    let finite: Vec<f64> = loss.iter().copied().filter(|l| l.is_finite()).collect();
    let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log = lo > 0.0 && hi / lo >= 10.0;
    let y = match (finite.is_empty(), log) {
        (true, _) => Axis::linear(0.0, 1.0, 0.0),
        (false, true) => Axis::log(lo, hi),
        (false, false) => Axis::linear(lo, hi, 0.0),
    };
    let x = Axis::linear(
        points.first().map_or(0.0, |p| p.0),
        points.last().map_or(1.0, |p| p.0),
        1.0,
    );
    let px = |s: f64| PAD + x.fraction(s) * (W - 2.0 * PAD);
    let py = |l: f64| H - PAD - y.fraction(l) * (H - 2.0 * PAD);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="20" text-anchor="middle" font-size="14">{title}</text>
<line x1="{PAD}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">step</text>
<text x="15" y="{}" transform="rotate(-90 15 {})" text-anchor="middle">{}</text>"#,
        W / 2.0,
        H - PAD,
        W - PAD,
        H - PAD,
        H - PAD,
        W / 2.0,
        H - PAD + 36.0,
        H / 2.0,
        H / 2.0,
        if log { "loss (log scale)" } else { "loss" },
    );
    for t in x.ticks() {
        let _ = writeln!(
            svg,
            r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="black"/><text x="{0:.1}" y="{3}" text-anchor="middle">{4}</text>"#,
            px(t),
            H - PAD,
            H - PAD + 5.0,
            H - PAD + 18.0,
            label(t)
        );
    }
    for t in y.ticks() {
        let _ = writeln!(
            svg,
            r##"<line x1="{0}" y1="{1:.1}" x2="{2}" y2="{1:.1}" stroke="#ddd"/><text x="{3}" y="{4:.1}" text-anchor="end">{5}</text>"##,
            PAD,
            py(t),
            W - PAD,
            PAD - 6.0,
            py(t) + 4.0,
            label(t)
        );
    }
    // The curve, broken where the loss is not finite.
    for run in points.split(|p| !p.1.is_finite()).filter(|r| !r.is_empty()) {
        svg.push_str(r#"<polyline fill="none" stroke="steelblue" stroke-width="1.5" points=""#);
        for &(s, l) in run {
            let _ = write!(svg, "{:.1},{:.1} ", px(s), py(l));
        }
        svg.push_str("\"/>\n");
    }
    let bad: Vec<f64> = points
        .iter()
        .filter(|p| !p.1.is_finite())
        .map(|p| p.0)
        .collect();
    for &s in &bad {
        let _ = writeln!(
            svg,
            r#"<line x1="{0:.1}" y1="{PAD}" x2="{0:.1}" y2="{1}" stroke="crimson" stroke-dasharray="4 3"/>"#,
            px(s),
            H - PAD
        );
    }
    if let Some(first) = bad.first() {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="40" text-anchor="middle" fill="crimson">{} step(s) with a non-finite loss (NaN or infinite), the first at step {first}: marked in red</text>"#,
            W / 2.0,
            bad.len()
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of every `<text>` element, in order.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.to_string()))
            .collect()
    }

    #[test]
    fn linear_axes_label_round_ticks_spanning_the_data() {
        let steps: Vec<u64> = (1..=100).collect();
        let loss: Vec<f64> = steps.iter().map(|&s| 5.0 - s as f64 / 50.0).collect();
        let svg = loss_curve("t", &steps, &loss);
        let labels = texts(&svg);
        for want in ["20", "40", "100", "3", "4", "5", "loss"] {
            assert!(labels.iter().any(|l| l == want), "{want} in {labels:?}");
        }
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert!(!svg.contains("non-finite"));
    }

    #[test]
    fn a_loss_spanning_decades_gets_a_log_axis() {
        let steps: Vec<u64> = (1..=50).collect();
        let loss: Vec<f64> = steps.iter().map(|&s| 100.0 / s as f64 / s as f64).collect();
        let labels = texts(&loss_curve("t", &steps, &loss));
        assert!(labels.iter().any(|l| l == "loss (log scale)"), "{labels:?}");
        for want in ["0.01", "0.1", "1", "10", "100"] {
            assert!(labels.iter().any(|l| l == want), "{want} in {labels:?}");
        }
    }

    #[test]
    fn non_finite_losses_are_marked_and_counted() {
        let steps = [1, 2, 3, 4];
        let loss = [5.5, 5.0, f64::NAN, f64::INFINITY];
        let svg = loss_curve("t", &steps, &loss);
        assert!(
            texts(&svg)
                .iter()
                .any(|l| l.starts_with("2 step(s) with a non-finite loss")
                    && l.contains("first at step 3")),
            "{svg}"
        );
        assert_eq!(svg.matches("crimson\" stroke-dasharray").count(), 2);
        // Every drawn point is a number.
        let points = svg.split("points=\"").skip(1).flat_map(|p| {
            let p = p.split('"').next().unwrap();
            p.split([' ', ',']).filter(|v| !v.is_empty())
        });
        assert!(
            points
                .into_iter()
                .all(|v| v.parse::<f64>().is_ok_and(f64::is_finite)),
            "{svg}"
        );
        // All of a run's losses non-finite still draws axes.
        let all_bad = loss_curve("t", &[1], &[f64::NAN]);
        assert!(all_bad.contains("first at step 1"));
        // Steps are whole numbers: so are their ticks.
        let step_ticks: Vec<String> = texts(&svg)[3..].iter().take(4).cloned().collect();
        assert_eq!(step_ticks, ["1", "2", "3", "4"]);
    }
}
