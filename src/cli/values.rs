//! The value parsers of every numeric flag, so that each refuses NaN, infinities, negative and
//! out-of-range values where it is parsed, with a sentence giving the valid range (clap adds
//! the flag's name). Negative numbers reach these parsers because every subcommand allows
//! them as values ([`super::command`]); otherwise clap would take `-1` for a flag.

use std::str::FromStr;

/// A whole number of 0 or more (counts and sizes whose 0 a later check names, seeds, ports).
pub fn whole<T: FromStr>(s: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{s} is not a whole number of 0 or more"))
}

/// A whole number of 1 or more (steps, repeats, sequences a step, bytes a value).
pub fn count<T: FromStr + PartialOrd + Default>(s: &str) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => Err(format!("{s} is not a whole number of 1 or more")),
    }
}

/// A finite number of 0 or more (learning rates, weight decay, a clipping norm, a latency):
/// NaN or a negative value would compute garbage without a word.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("{s} is not a finite number of 0 or more")),
    }
}

/// A finite number above 0 (rates and bandwidths, which divide).
pub fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("{s} is not a finite number above 0")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_parser_refuses_what_is_outside_its_range() {
        assert_eq!(whole::<usize>("0"), Ok(0));
        assert!(whole::<usize>("-3").unwrap_err().contains("0 or more"));
        assert_eq!(count::<u64>("2"), Ok(2));
        for bad in ["0", "-1", "1.5", "x"] {
            assert!(
                count::<usize>(bad).unwrap_err().contains("1 or more"),
                "{bad}"
            );
        }
        assert_eq!(non_negative("0"), Ok(0.0));
        assert_eq!(positive("1e-3"), Ok(1e-3));
        for bad in ["nan", "inf", "-inf", "-1"] {
            assert!(non_negative(bad).is_err(), "{bad}");
            assert!(positive(bad).is_err(), "{bad}");
        }
        assert!(positive("0").unwrap_err().contains("above 0"));
    }
}
