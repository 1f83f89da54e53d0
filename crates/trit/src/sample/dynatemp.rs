//! Dynamic temperature (llama.cpp's `--dynatemp-range` / `--dynatemp-exp`): the temperature of
//! a step moves within `temperature ± range` with the normalized entropy of the candidates the
//! truncation samplers kept — a confident step is sampled cooler, a flat one hotter:
//! `t = lo + (hi − lo) · (H / ln n)^exponent`, `lo = max(0, temperature − range)`,
//! `hi = temperature + range`. f32 as llama.cpp's; checked against its `temp_ext` sampler
//! (`tools/ref_truncation.py`).

#[derive(Clone, Debug, PartialEq)]
pub struct DynamicTemperature {
    /// > 0 enables.
    pub range: f32,
    pub exponent: f32,
}

impl DynamicTemperature {
    /// The temperature for candidates with these logits, around `temperature`.
    pub fn temperature(&self, temperature: f32, logits: &[f32]) -> f32 {
        if self.range <= 0.0 || logits.len() <= 1 {
            return temperature;
        }
        let lo = (temperature - self.range).max(0.0);
        let hi = temperature + self.range;
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        let e: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        let entropy: f32 = e
            .iter()
            .map(|&x| x / sum)
            .filter(|&p| p > 0.0)
            .map(|p| -p * p.ln())
            .sum();
        let max_entropy = -(1.0 / logits.len() as f32).ln();
        lo + (hi - lo) * (entropy / max_entropy).powf(self.exponent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_steps_run_hot_and_peaked_ones_cool() {
        let d = DynamicTemperature {
            range: 0.5,
            exponent: 1.0,
        };
        assert!(
            (d.temperature(1.0, &[0.0; 8]) - 1.5).abs() < 1e-5,
            "flat: the top"
        );
        let peaked = d.temperature(1.0, &[30.0, 0.0, 0.0, 0.0]);
        assert!((peaked - 0.5).abs() < 1e-3, "{peaked}");
        assert_eq!(d.temperature(1.0, &[3.0]), 1.0, "one candidate: as it is");
        let off = DynamicTemperature { range: 0.0, ..d };
        assert_eq!(off.temperature(0.7, &[0.0, 1.0]), 0.7);
    }
}
