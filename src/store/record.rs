//! One revision as the `REVISIONS` table stores it: what happened, when, to which kind,
//! and the object's JSON as committed, byte for byte.
//!
//! A short binary head, then the JSON: the head is read without scanning the object, and
//! the object is sliced out as it is (the JSON is the larger part of every row, and it is
//! what the cache keeps).
//!
//! ```text
//! byte 0        event type: 1 ADDED, 2 MODIFIED, 3 DELETED
//! bytes 1..9    commit time, Unix milliseconds, i64 little-endian
//! bytes 9..11   n = length of the kind's name, u16 little-endian
//! bytes 11..    the kind's plural name (n bytes, UTF-8), then the object's JSON
//! ```

use super::watch::EventType;

/// The bytes before the kind's name.
pub(super) const HEAD: usize = 11;

/// One revision's row, borrowed from the table's bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Record<'a> {
    pub type_: EventType,
    /// Commit time, Unix milliseconds.
    pub time_ms: i64,
    /// The plural resource name.
    pub kind: &'a str,
    /// The object's JSON, exactly as committed (not checked here: `Obj::load` does).
    pub object: &'a [u8],
}

impl Record<'_> {
    /// The row's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut row = Vec::new();
        self.encode_into(&mut row);
        row
    }

    /// Appends the row's bytes to `row`.
    pub fn encode_into(&self, row: &mut Vec<u8>) {
        // Kinds are the API's plural names, compile-time constants far below 64 KiB.
        let kind_len = u16::try_from(self.kind.len()).expect("a kind's name fits in 64 KiB");
        row.reserve(HEAD + self.kind.len() + self.object.len());
        row.push(type_code(self.type_));
        row.extend_from_slice(&self.time_ms.to_le_bytes());
        row.extend_from_slice(&kind_len.to_le_bytes());
        row.extend_from_slice(self.kind.as_bytes());
        row.extend_from_slice(self.object);
    }

    /// Reads a row; the error says what is wrong with it.
    pub fn decode(row: &[u8]) -> Result<Record<'_>, String> {
        let Some((head, rest)) = row.split_first_chunk::<HEAD>() else {
            return Err(format!("{} bytes is too short for a revision", row.len()));
        };
        let type_ = match head[0] {
            1 => EventType::Added,
            2 => EventType::Modified,
            3 => EventType::Deleted,
            other => return Err(format!("unknown event type {other}")),
        };
        let time_ms = i64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        let kind_len = usize::from(u16::from_le_bytes([head[9], head[10]]));
        if rest.len() < kind_len {
            return Err(format!("the kind's name ({kind_len} bytes) runs past the row"));
        }
        let (kind, object) = rest.split_at(kind_len);
        let kind = std::str::from_utf8(kind).map_err(|_| "the kind's name is not UTF-8".to_owned())?;
        Ok(Record { type_, time_ms, kind, object })
    }
}

fn type_code(type_: EventType) -> u8 {
    match type_ {
        EventType::Added => 1,
        EventType::Modified => 2,
        EventType::Deleted => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        for type_ in [EventType::Added, EventType::Modified, EventType::Deleted] {
            let record = Record { type_, time_ms: -5, kind: "fleetcommands", object: br#"{"a":1}"# };
            assert_eq!(Record::decode(&record.encode()).unwrap(), record);
        }
    }

    #[test]
    fn a_damaged_record_is_an_error_not_a_panic() {
        let row = Record { type_: EventType::Added, time_ms: 1, kind: "agents", object: b"{}" }.encode();
        for cut in 0..HEAD + 6 {
            assert!(Record::decode(&row[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_type = row.clone();
        bad_type[0] = 9;
        assert_eq!(Record::decode(&bad_type).unwrap_err(), "unknown event type 9");
        let mut bad_kind = row;
        bad_kind[HEAD] = 0xff;
        assert!(Record::decode(&bad_kind).is_err());
    }
}
