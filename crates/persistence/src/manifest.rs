//! The manifest: which files make up the persisted state, in load order. A short text file,
//! replaced atomically (so a crash leaves the old list or the new one), ending in its own
//! checksum so a damaged one is refused rather than half-read.
//!
//! ```text
//! chorus-appendonly 1
//! generation 7
//! base base.7
//! incr incr.7
//! crc 1a2b3c4d
//! ```

pub const NAME: &str = "manifest";
const HEADER: &str = "chorus-appendonly 1";

pub fn base_name(generation: u64) -> String {
    format!("base.{generation}")
}

pub fn incr_name(generation: u64) -> String {
    format!("incr.{generation}")
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub generation: u64,
    pub base: Option<String>,
    /// Oldest first; the last is the one appended to.
    pub incrs: Vec<String>,
}

impl Manifest {
    /// Every file in load order: the base, then the incrs.
    pub fn files(&self) -> Vec<String> {
        self.base.iter().chain(&self.incrs).cloned().collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut text = format!("{HEADER}\ngeneration {}\n", self.generation);
        if let Some(base) = &self.base {
            text.push_str(&format!("base {base}\n"));
        }
        for incr in &self.incrs {
            text.push_str(&format!("incr {incr}\n"));
        }
        let crc = chorus_storage::checksum(&[text.as_bytes()]);
        text.push_str(&format!("crc {crc:08x}\n"));
        text.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not text".to_string())?;
        let body_end = text.rfind("crc ").ok_or("no checksum line")?;
        let (body, crc_line) = text.split_at(body_end);
        let crc = u32::from_str_radix(crc_line.trim_start_matches("crc ").trim(), 16)
            .map_err(|_| "unreadable checksum")?;
        if chorus_storage::checksum(&[body.as_bytes()]) != crc {
            return Err("checksum mismatch".into());
        }
        let mut lines = body.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!("does not start with {HEADER:?}"));
        }
        let mut manifest = Manifest::default();
        for line in lines {
            let (field, value) = line.split_once(' ').ok_or_else(|| format!("malformed line {line:?}"))?;
            let valid_name = !value.is_empty() && !value.contains('/') && !value.starts_with('.');
            match field {
                "generation" => {
                    manifest.generation = value.parse().map_err(|_| format!("bad generation {value:?}"))?
                }
                "base" if valid_name => manifest.base = Some(value.to_string()),
                "incr" if valid_name => manifest.incrs.push(value.to_string()),
                _ => return Err(format!("malformed line {line:?}")),
            }
        }
        if manifest.incrs.is_empty() {
            return Err("lists no incremental file".into());
        }
        Ok(manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_is_refused() {
        let manifest =
            Manifest { generation: 3, base: Some(base_name(3)), incrs: vec![incr_name(2), incr_name(3)] };
        let bytes = manifest.encode();
        assert_eq!(Manifest::decode(&bytes).unwrap(), manifest);
        let mut damaged = bytes.clone();
        damaged[25] ^= 1;
        assert!(Manifest::decode(&damaged).is_err());
        assert!(Manifest::decode(b"chorus-appendonly 1\nincr ../x\n").is_err());
    }
}
