//! HAMi-core's per-container shared region (`shared_region::decode`), a
//! file every process of a GPU container can write and the node-daemon
//! reads. Either it is refused with an error, or the region re-encodes to
//! bytes that decode to the same region.
//!
//! A real file is 1.2 or 2 MB, beyond libFuzzer's `-max_len`, so an input is
//! also expanded into a full-length file: byte 0 picks the length (even: v0,
//! odd: v1), bytes 1–2 (little-endian) how many of the remaining bytes
//! overwrite the zeroed file from offset 0 (header, limits, first process
//! slots); the bytes after those end at the struct's last byte (proc_num,
//! priority, last kernel time). `proto/tests/shared_region_seeds.rs` writes
//! the seed corpus in this form and must expand it the same way.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::hami::shared_region::{Layout, decode, encode};

fn check(bytes: &[u8]) {
    if let Ok(region) = decode(bytes) {
        let again = encode(&region).expect("a decoded region encodes");
        let back = decode(&again).expect("an encoded region decodes");
        assert_eq!(region, back, "round trip");
    }
}

fn expand(data: &[u8]) -> Option<Vec<u8>> {
    let (&pick, rest) = data.split_first()?;
    let layout = if pick.is_multiple_of(2) {
        Layout::V0
    } else {
        Layout::V1 { minor: 0 }
    };
    let (split, rest) = rest.split_first_chunk::<2>()?;
    let (head, tail) = rest.split_at(usize::from(u16::from_le_bytes(*split)).min(rest.len()));
    let mut file = vec![0u8; layout.file_len()];
    let head = &head[..head.len().min(file.len())];
    file[..head.len()].copy_from_slice(head);
    let end = layout.struct_size();
    let tail = &tail[tail.len().saturating_sub(end)..];
    file[end - tail.len()..end].copy_from_slice(tail);
    Some(file)
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(file) = expand(data) {
        check(&file);
    }
});
