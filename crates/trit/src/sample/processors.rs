//! Penalties applied to raw logits before sampling, llama.cpp style:
//! repetition (divide positive / multiply negative logits of recent tokens),
//! presence (subtract once per seen token) and frequency (subtract per occurrence).

use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    pub repetition: f32,
    pub presence: f32,
    pub frequency: f32,
    /// How many of the most recent tokens count (llama.cpp's `penalty_last_n`).
    pub last_n: usize,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties {
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
            last_n: 64,
        }
    }
}

impl Penalties {
    pub fn is_neutral(&self) -> bool {
        self.repetition == 1.0 && self.presence == 0.0 && self.frequency == 0.0
    }

    pub fn apply(&self, logits: &mut [f32], history: &[u32]) {
        if self.is_neutral() || self.last_n == 0 {
            return;
        }
        let recent = &history[history.len().saturating_sub(self.last_n)..];
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in recent {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &count) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if self.repetition != 1.0 {
                *l = if *l > 0.0 {
                    *l / self.repetition
                } else {
                    *l * self.repetition
                };
            }
            *l -= self.presence + self.frequency * count as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_presence_frequency() {
        let p = Penalties {
            repetition: 2.0,
            presence: 0.5,
            frequency: 0.25,
            last_n: 3,
        };
        let mut l = vec![4.0, -4.0, 1.0, 1.0];
        // token 3 is outside the window of the last 3 tokens
        p.apply(&mut l, &[3, 0, 1, 1]);
        assert_eq!(l, vec![4.0 / 2.0 - 0.75, -8.0 - 1.0, 1.0, 1.0]);
        let mut same = vec![4.0, -4.0];
        Penalties::default().apply(&mut same, &[0, 1]);
        assert_eq!(same, vec![4.0, -4.0]);
    }
}
