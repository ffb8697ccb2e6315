//! Makes the kubelet's plugin-registration calls acceptable to our HTTP/2
//! server.
//!
//! The kubelet's plugin watcher dials a registration socket with its bare
//! path as the gRPC target (`pluginmanager/operationexecutor`, `dial`), so
//! grpc-go sends that path as the `:authority` pseudo-header. The `h2` crate
//! under tonic refuses such a request (a path is not a URI authority) with
//! `RST_STREAM PROTOCOL_ERROR`, and the kubelet never learns about the
//! plugin (kubernetes/kubernetes#109081 and hyperium/tonic#742 describe it).
//!
//! Each connection to the registration socket therefore goes through
//! [`rewrite_client_to_server`], which forwards the client's HTTP/2 frames
//! unchanged except header blocks: those are re-encoded (HPACK, RFC 7541)
//! with `:authority` set to `localhost`, and with every field as a literal
//! that does not touch the server's dynamic table. The client's own dynamic
//! table entries are remembered as their encoded bytes (no Huffman decoding
//! is needed: a string is copied as it came), so a field the client sends
//! as a reference to its table is written out as that literal. Frames from
//! the server are passed through untouched.

use std::collections::VecDeque;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// Frame flags.
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Largest frame payload every peer accepts (the protocol's default).
const MAX_FRAME: usize = 16_384;
/// The static table's size; dynamic indices start after it.
const STATIC_ENTRIES: u64 = 61;
/// Static index of `:authority`.
const AUTHORITY: u64 = 1;
/// What `:authority` is replaced with.
const LOCALHOST: &[u8] = b"localhost";

/// Why a header block could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ends inside a representation.
    #[error("header block truncated")]
    Truncated,
    /// An integer too large to be an index or a length.
    #[error("header block integer overflows")]
    Overflow,
    /// A reference to an index that is in neither table.
    #[error("header block refers to index {0}, which is not in the table")]
    Index(u64),
}

/// A header name: a static-table index or a literal string (encoded bytes,
/// the H flag and length prefix included).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    Static(u64),
    Literal(Vec<u8>),
}

/// One entry of the client's dynamic table, as encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: Name,
    /// The value string's encoded bytes.
    value: Vec<u8>,
}

/// The state of one connection's client-to-server header translation.
#[derive(Debug, Default)]
pub struct Translator {
    /// The client's dynamic table, newest first (never evicted: the client
    /// never refers to an entry it evicted, and the indices of the others
    /// do not depend on the evicted ones).
    table: VecDeque<Entry>,
}

fn read_int(block: &[u8], at: &mut usize, prefix: u8) -> Result<u64, HpackError> {
    let first = *block.get(*at).ok_or(HpackError::Truncated)?;
    *at += 1;
    let max = (1u64 << prefix) - 1;
    let mut value = u64::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0u32;
    loop {
        let byte = *block.get(*at).ok_or(HpackError::Truncated)?;
        *at += 1;
        if shift > 56 {
            return Err(HpackError::Overflow);
        }
        value += u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
}

fn write_int(out: &mut Vec<u8>, pattern: u8, prefix: u8, value: u64) {
    let max = (1u64 << prefix) - 1;
    if value < max {
        // Fits the prefix (value < max ≤ 255).
        out.push(pattern | u8::try_from(value).unwrap_or(0));
        return;
    }
    out.push(pattern | u8::try_from(max).unwrap_or(0));
    let mut rest = value - max;
    while rest >= 128 {
        out.push(u8::try_from(rest & 0x7f).unwrap_or(0) | 0x80);
        rest >>= 7;
    }
    out.push(u8::try_from(rest).unwrap_or(0));
}

/// A string's encoded bytes (H flag, length, octets), copied.
fn read_string(block: &[u8], at: &mut usize) -> Result<Vec<u8>, HpackError> {
    let start = *at;
    let length = usize::try_from(read_int(block, at, 7)?).map_err(|_| HpackError::Overflow)?;
    let end = at.checked_add(length).ok_or(HpackError::Overflow)?;
    if end > block.len() {
        return Err(HpackError::Truncated);
    }
    *at = end;
    Ok(block[start..end].to_vec())
}

fn raw_string(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 1);
    write_int(&mut out, 0x00, 7, bytes.len() as u64);
    out.extend_from_slice(bytes);
    out
}

impl Translator {
    fn entry(&self, index: u64) -> Result<&Entry, HpackError> {
        usize::try_from(index - STATIC_ENTRIES - 1)
            .ok()
            .and_then(|i| self.table.get(i))
            .ok_or(HpackError::Index(index))
    }

    /// The name of a literal field: index 0 means a literal string follows.
    fn name(&self, block: &[u8], at: &mut usize, prefix: u8) -> Result<Name, HpackError> {
        match read_int(block, at, prefix)? {
            0 => Ok(Name::Literal(read_string(block, at)?)),
            i if i <= STATIC_ENTRIES => Ok(Name::Static(i)),
            i => Ok(self.entry(i)?.name.clone()),
        }
    }

    /// A literal field without indexing, `:authority` set to `localhost`.
    fn emit(out: &mut Vec<u8>, name: &Name, value: &[u8]) {
        match name {
            Name::Static(i) => write_int(out, 0x00, 4, *i),
            Name::Literal(bytes) => {
                out.push(0x00);
                out.extend_from_slice(bytes);
            }
        }
        if *name == Name::Static(AUTHORITY) {
            out.extend_from_slice(&raw_string(LOCALHOST));
        } else {
            out.extend_from_slice(value);
        }
    }

    /// Translates one complete header block from the client.
    ///
    /// # Errors
    /// [`HpackError`] for a block that does not decode.
    pub fn translate(&mut self, block: &[u8]) -> Result<Vec<u8>, HpackError> {
        let mut out = Vec::with_capacity(block.len() + 16);
        let mut at = 0;
        while at < block.len() {
            let first = block[at];
            if first & 0x80 != 0 {
                // Indexed field.
                let index = read_int(block, &mut at, 7)?;
                if index == 0 {
                    return Err(HpackError::Index(0));
                }
                if index <= STATIC_ENTRIES && index != AUTHORITY {
                    write_int(&mut out, 0x80, 7, index);
                } else if index <= STATIC_ENTRIES {
                    Self::emit(&mut out, &Name::Static(AUTHORITY), &[]);
                } else {
                    let entry = self.entry(index)?.clone();
                    Self::emit(&mut out, &entry.name, &entry.value);
                }
            } else if first & 0xc0 == 0x40 {
                // Literal with incremental indexing: remembered, emitted
                // without.
                let name = self.name(block, &mut at, 6)?;
                let value = read_string(block, &mut at)?;
                Self::emit(&mut out, &name, &value);
                self.table.push_front(Entry { name, value });
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update: the server's table stays empty.
                read_int(block, &mut at, 5)?;
            } else {
                // Literal without indexing (0000) or never indexed (0001).
                let never = first & 0xf0 == 0x10;
                let name = self.name(block, &mut at, 4)?;
                let value = read_string(block, &mut at)?;
                let start = out.len();
                Self::emit(&mut out, &name, &value);
                if never {
                    out[start] |= 0x10;
                }
            }
        }
        Ok(out)
    }
}

/// Writes `block` as one HEADERS frame (and CONTINUATION frames when it is
/// larger than a frame), keeping the END_STREAM flag of `flags`.
fn write_headers(out: &mut Vec<u8>, stream: [u8; 4], flags: u8, block: &[u8]) {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![&[][..]]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut f = if i == 0 {
            flags & !(PADDED | PRIORITY | END_HEADERS)
        } else {
            0
        };
        if i == last {
            f |= END_HEADERS;
        }
        let length = u32::try_from(chunk.len()).unwrap_or(0).to_be_bytes();
        out.extend_from_slice(&length[1..]);
        out.push(kind);
        out.push(f);
        out.extend_from_slice(&stream);
        out.extend_from_slice(chunk);
    }
}

/// The header block fragment of a HEADERS frame's payload (padding and
/// priority removed).
fn fragment(flags: u8, payload: &[u8]) -> std::io::Result<&[u8]> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HEADERS frame");
    let mut start = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let pad = usize::from(*payload.first().ok_or_else(bad)?);
        start = 1;
        end = end.checked_sub(pad).ok_or_else(bad)?;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end).ok_or_else(bad)
}

/// Copies the client's side of one connection to the server, translating
/// every header block (see the module docs), until the client closes.
///
/// # Errors
/// An I/O error, or a header block that does not decode.
pub async fn rewrite_client_to_server(
    mut client: impl AsyncRead + Unpin,
    mut server: impl AsyncWrite + Unpin,
) -> std::io::Result<()> {
    let mut preface = [0u8; 24];
    client.read_exact(&mut preface).await?;
    server.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: pass it along as it is.
        tokio::io::copy(&mut client, &mut server).await?;
        return Ok(());
    }
    let mut translator = Translator::default();
    // A HEADERS frame waiting for its CONTINUATION frames: flags, stream,
    // the block so far.
    let mut pending: Option<(u8, [u8; 4], Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match client.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = [head[5], head[6], head[7], head[8]];
        let mut payload = vec![0u8; length];
        client.read_exact(&mut payload).await?;
        let block = match (kind, pending.take()) {
            (HEADERS, None) => Some((flags, stream, fragment(flags, &payload)?.to_vec())),
            (CONTINUATION, Some((f, s, mut block))) => {
                block.extend_from_slice(&payload);
                Some((f, s, block))
            }
            (_, Some(_)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "a frame interrupted a header block",
                ));
            }
            _ => None,
        };
        let Some((f, s, block)) = block else {
            server.write_all(&head).await?;
            server.write_all(&payload).await?;
            continue;
        };
        if flags & END_HEADERS == 0 {
            pending = Some((f, s, block));
            continue;
        }
        let translated = translator
            .translate(&block)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let mut out = Vec::with_capacity(translated.len() + 9);
        write_headers(&mut out, s, f, &translated);
        server.write_all(&out).await?;
    }
    server.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Literal with incremental indexing of `:authority` (static name 1).
    fn authority_literal(path: &[u8]) -> Vec<u8> {
        let mut b = vec![0x41];
        b.extend(raw_string(path));
        b
    }

    #[test]
    fn the_authority_becomes_localhost_and_the_server_table_stays_empty() {
        let mut t = Translator::default();
        let path = b"/var/lib/kubelet/plugins_registry/gpu.gpuslice.dev-reg.sock";
        // :method POST (static 3), :authority <path> (indexed literal),
        // content-type (static name 31) with a Huffman value kept as is.
        let mut first = vec![0x83];
        first.extend(authority_literal(path));
        first.extend([0x5f, 0x83, 0xaa, 0xbb, 0xcc]);
        let out = t.translate(&first).unwrap();
        let mut want = vec![0x83, 0x01];
        want.extend(raw_string(LOCALHOST));
        // content-type: name index 31 in a 4-bit prefix (15, then 16).
        want.extend([0x0f, 0x10, 0x83, 0xaa, 0xbb, 0xcc]);
        assert_eq!(out, want);
        // The next request refers to the client's table: 62 is the newest
        // entry (content-type), 63 the authority; a size update is dropped.
        let out = t.translate(&[0x20, 0x83, 0xbf, 0xbe]).unwrap();
        let mut want = vec![0x83, 0x01];
        want.extend(raw_string(LOCALHOST));
        want.extend([0x0f, 0x10, 0x83, 0xaa, 0xbb, 0xcc]);
        assert_eq!(out, want);
    }

    #[test]
    fn literal_names_never_indexed_fields_and_long_integers_survive() {
        let mut t = Translator::default();
        let mut block = vec![0x10];
        block.extend(raw_string(b"x-secret"));
        block.extend(raw_string(b"v"));
        // A dynamic-name literal: first index it, then refer to its name.
        block.push(0x40);
        block.extend(raw_string(b"x-a"));
        block.extend(raw_string(b"1"));
        block.push(0x0f); // name index 62 in a 4-bit prefix: 15 + 47
        block.push(47);
        block.extend(raw_string(b"2"));
        let out = t.translate(&block).unwrap();
        let mut want = vec![0x10];
        want.extend(raw_string(b"x-secret"));
        want.extend(raw_string(b"v"));
        want.push(0x00);
        want.extend(raw_string(b"x-a"));
        want.extend(raw_string(b"1"));
        want.push(0x00);
        want.extend(raw_string(b"x-a"));
        want.extend(raw_string(b"2"));
        assert_eq!(out, want);
    }

    #[test]
    fn bad_blocks_are_named() {
        let mut t = Translator::default();
        assert_eq!(t.translate(&[0xbe]), Err(HpackError::Index(62)));
        assert_eq!(t.translate(&[0x41, 0x05, b'a']), Err(HpackError::Truncated));
        assert_eq!(t.translate(&[0x80]), Err(HpackError::Index(0)));
        assert_eq!(
            t.translate(&[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
            ]),
            Err(HpackError::Overflow)
        );
    }

    proptest::proptest! {
        /// Whatever the client sends, the translation answers (a block or
        /// an error) and never panics; what it emits never touches the
        /// server's dynamic table.
        #[test]
        fn any_block_translates_or_is_refused(
            blocks in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), 1..4),
        ) {
            let mut t = Translator::default();
            for block in blocks {
                if let Ok(out) = t.translate(&block) {
                    let again = Translator::default();
                    let mut at = 0;
                    while at < out.len() {
                        let first = out[at];
                        proptest::prop_assert!(first & 0xc0 != 0x40 && first & 0xe0 != 0x20);
                        if first & 0x80 != 0 {
                            read_int(&out, &mut at, 7).unwrap();
                        } else {
                            again.name(&out, &mut at, 4).unwrap();
                            read_string(&out, &mut at).unwrap();
                        }
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn frames_pass_through_and_header_blocks_are_rewritten() {
        let mut input = PREFACE.to_vec();
        // SETTINGS (type 4), empty, stream 0.
        input.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
        // HEADERS split over a CONTINUATION, padded.
        let block = authority_literal(b"/p.sock");
        let (a, b) = block.split_at(3);
        let mut headers = vec![2u8]; // pad length
        headers.extend_from_slice(a);
        headers.extend([0, 0]);
        input.extend([
            0,
            0,
            u8::try_from(headers.len()).unwrap(),
            HEADERS,
            PADDED | 0x1,
            0,
            0,
            0,
            1,
        ]);
        input.extend(&headers);
        input.extend([
            0,
            0,
            u8::try_from(b.len()).unwrap(),
            CONTINUATION,
            END_HEADERS,
            0,
            0,
            0,
            1,
        ]);
        input.extend_from_slice(b);
        let mut out = Vec::new();
        rewrite_client_to_server(&input[..], &mut out)
            .await
            .unwrap();
        let mut want = PREFACE.to_vec();
        want.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let mut translated = vec![0x01];
        translated.extend(raw_string(LOCALHOST));
        want.extend([
            0,
            0,
            u8::try_from(translated.len()).unwrap(),
            HEADERS,
            END_HEADERS | 0x1,
            0,
            0,
            0,
            1,
        ]);
        want.extend(translated);
        assert_eq!(out, want);
    }
}
