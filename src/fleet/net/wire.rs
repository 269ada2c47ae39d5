//! The framing every fleet protocol uses on a QUIC bi stream: a message is a u32
//! big-endian length followed by that many bytes of JSON. A size cap keeps a broken or
//! hostile peer from making us allocate without bound.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest message body accepted or sent, in bytes (1 MiB).
pub const MAX_MESSAGE: usize = 1 << 20;

/// Why a message could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The stream ended cleanly before a new message began (the peer finished).
    #[error("the stream ended")]
    Ended,
    /// The stream ended inside a message.
    #[error("the stream ended inside a message: got {got} of {expected} bytes")]
    Truncated {
        /// Bytes expected (of the length prefix or of the body).
        expected: usize,
        /// Bytes received before the end.
        got: usize,
    },
    /// A message is larger than [`MAX_MESSAGE`].
    #[error("a message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Its announced (or encoded) length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The body is not the JSON of the expected message.
    #[error("undecodable message: {source}")]
    Decode {
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The message could not be encoded.
    #[error("unencodable message: {source}")]
    Encode {
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The stream failed.
    #[error("stream error: {source}")]
    Io {
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
}

/// Encodes `message` as one frame (length prefix + JSON).
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let body = serde_json::to_vec(message).map_err(|source| WireError::Encode { source })?;
    if body.len() > MAX_MESSAGE {
        return Err(WireError::TooLarge { len: body.len(), max: MAX_MESSAGE });
    }
    // The cap is far below u32::MAX, so the length always fits.
    let len =
        u32::try_from(body.len()).map_err(|_| WireError::TooLarge { len: body.len(), max: MAX_MESSAGE })?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes one message and flushes it.
pub async fn write_message<W, T>(writer: &mut W, message: &T) -> Result<(), WireError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let frame = encode(message)?;
    writer.write_all(&frame).await.map_err(|source| WireError::Io { source })?;
    writer.flush().await.map_err(|source| WireError::Io { source })
}

/// Reads exactly `buf.len()` bytes; returns how many arrived before the end of the stream.
async fn fill<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> Result<usize, WireError> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => return Err(WireError::Io { source }),
        }
    }
    Ok(got)
}

/// Reads one message. A stream that ends before the first byte is [`WireError::Ended`].
pub async fn read_message<R, T>(reader: &mut R) -> Result<T, WireError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut prefix = [0u8; 4];
    match fill(reader, &mut prefix).await? {
        0 => return Err(WireError::Ended),
        4 => {}
        got => return Err(WireError::Truncated { expected: 4, got }),
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_MESSAGE {
        return Err(WireError::TooLarge { len, max: MAX_MESSAGE });
    }
    let mut body = vec![0u8; len];
    let got = fill(reader, &mut body).await?;
    if got < len {
        return Err(WireError::Truncated { expected: len, got });
    }
    serde_json::from_slice(&body).map_err(|source| WireError::Decode { source })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Ping {
        n: u32,
    }

    async fn read_from(bytes: &[u8]) -> Result<Ping, WireError> {
        let mut reader = bytes;
        read_message(&mut reader).await
    }

    #[tokio::test]
    async fn messages_round_trip_in_order() {
        let mut buf = Vec::new();
        write_message(&mut buf, &Ping { n: 1 }).await.unwrap();
        write_message(&mut buf, &Ping { n: 2 }).await.unwrap();
        assert_eq!(&buf[..4], &[0, 0, 0, 7]);
        let mut reader = buf.as_slice();
        assert_eq!(read_message::<_, Ping>(&mut reader).await.unwrap(), Ping { n: 1 });
        assert_eq!(read_message::<_, Ping>(&mut reader).await.unwrap(), Ping { n: 2 });
        assert!(matches!(read_message::<_, Ping>(&mut reader).await, Err(WireError::Ended)));
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_before_reading_the_body() {
        let len = (MAX_MESSAGE as u32 + 1).to_be_bytes();
        let err = read_from(&len).await.unwrap_err();
        assert!(matches!(err, WireError::TooLarge { len, .. } if len == MAX_MESSAGE + 1), "{err}");
        assert!(err.to_string().contains("exceeds the limit of 1048576 bytes"), "{err}");
    }

    #[tokio::test]
    async fn an_oversized_message_is_not_sent() {
        let big = "x".repeat(MAX_MESSAGE);
        let mut buf = Vec::new();
        let err = write_message(&mut buf, &big).await.unwrap_err();
        assert!(matches!(err, WireError::TooLarge { .. }), "{err}");
        assert!(buf.is_empty());
    }

    #[tokio::test]
    async fn truncated_prefixes_and_bodies_say_how_much_arrived() {
        let err = read_from(&[0, 0]).await.unwrap_err();
        assert_eq!(err.to_string(), "the stream ended inside a message: got 2 of 4 bytes");
        let err = read_from(&[0, 0, 0, 10, b'{', b'"']).await.unwrap_err();
        assert_eq!(err.to_string(), "the stream ended inside a message: got 2 of 10 bytes");
    }

    #[tokio::test]
    async fn garbage_and_wrong_shapes_are_decode_errors() {
        let mut frame = 5u32.to_be_bytes().to_vec();
        frame.extend_from_slice(b"\xff\x00ab}");
        let err = read_from(&frame).await.unwrap_err();
        assert!(matches!(err, WireError::Decode { .. }), "{err}");
        let err = read_from(&encode(&serde_json::json!({"m": 1})).unwrap()).await.unwrap_err();
        assert!(err.to_string().starts_with("undecodable message: missing field `n`"), "{err}");
    }
}
