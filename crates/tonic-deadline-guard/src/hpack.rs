//! A shadow of a server's HPACK decoder (RFC 7541) that keeps of each
//! header block only its `grpc-timeout`.
//!
//! A header block refers to a dynamic table both ends keep in step, so
//! reading one header means following every block of the connection. The
//! shadow keeps the table's entries without their text — each entry's
//! sizes, and whether it is a `grpc-timeout` with which deadline — and
//! decodes a string only as far as it must: its length, and the text of a
//! name that may be `grpc-timeout` and of that header's value. No
//! allocation but the table's own growth.

use std::collections::VecDeque;
use std::time::Duration;

use grpc_deadline::timeout_header;

/// The header the shadow reads.
const GRPC_TIMEOUT: &[u8] = b"grpc-timeout";

/// The largest dynamic table the shadow follows. A server's decoder allows
/// 4 096 bytes unless its SETTINGS say more; a block that asks for more
/// than this is malformed to the shadow.
const MAX_TABLE: usize = 64 * 1024;

/// Why a header block could not be followed: the connection's decoder
/// fails on it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// An entry of the dynamic table, without its text.
#[derive(Debug, Clone, Copy)]
struct Entry {
    name_len: usize,
    /// Its size as HPACK counts it: name, value and 32.
    size: usize,
    /// The name is `grpc-timeout`.
    is_timeout: bool,
    /// Its value read as a `grpc-timeout`, when it is one and valid.
    timeout: Option<Duration>,
}

/// The dynamic table of one direction of one connection.
#[derive(Debug)]
pub(crate) struct Shadow {
    /// Newest first: index 62 is the front.
    entries: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// Which of the newest 64 entries are `grpc-timeout`s: bit `i` for
    /// index `62 + i`. An indexed field is looked up only where its bit is
    /// set (or beyond the mask).
    timeout_mask: u64,
}

impl Default for Shadow {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max_size: 4096,
            timeout_mask: 0,
        }
    }
}

impl Shadow {
    /// Follows one whole header block; its `grpc-timeout` (the first, if
    /// it has several, as the server reads it), `None` without one or with
    /// one that is not valid.
    pub(crate) fn decode(&mut self, block: &[u8]) -> Result<Option<Duration>, Malformed> {
        let mut pos = 0;
        // `Some` once a `grpc-timeout` was seen.
        let mut timeout: Option<Option<Duration>> = None;
        while let Some(&first) = block.get(pos) {
            if first & 0x80 != 0 && first != 0xff {
                // Indexed header field, its index in one byte: most of a
                // request's, once the table holds its headers. A field
                // whose entry is no `grpc-timeout` is passed over (an index
                // out of the table is the connection's decoder's to refuse).
                pos += 1;
                let dynamic = usize::from(first & 0x7f).wrapping_sub(62);
                if dynamic < 64 && self.timeout_mask >> dynamic & 1 != 0 {
                    let entry = self.entries.get(dynamic).ok_or(Malformed)?;
                    timeout.get_or_insert(entry.timeout);
                }
            } else if first & 0xe0 == 0
                && let Some(next) = static_literal(block, pos)
            {
                // A literal not indexed under a static name (the static
                // table has no `grpc-timeout`): the `:path` of every
                // request, which encoders never index, a `content-type`
                // some send so. Its value is passed over unread.
                pos = next;
            } else {
                pos = self.field(block, pos, &mut timeout)?;
            }
        }
        if pos > block.len() {
            // A string that ran past the block.
            return Err(Malformed);
        }
        Ok(timeout.flatten())
    }

    /// Any other field, at `pos`: where the next begins. Out of line, so
    /// that the loop over the usual fields keeps its place in a register.
    #[inline(never)]
    fn field(
        &mut self,
        block: &[u8],
        mut pos: usize,
        timeout: &mut Option<Option<Duration>>,
    ) -> Result<usize, Malformed> {
        let first = block[pos];
        if first & 0x80 != 0 {
            // Indexed header field, its index in more than one byte.
            let index = integer(block, &mut pos, 7)?;
            if let Some(entry) = self.dynamic(index)?
                && entry.is_timeout
            {
                timeout.get_or_insert(entry.timeout);
            }
        } else if first & 0xc0 == 0x40 {
            // Literal with incremental indexing.
            if let Some(read) = self.literal(block, &mut pos, 6, true)? {
                timeout.get_or_insert(read);
            }
        } else if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            let size = integer(block, &mut pos, 5)?;
            if size > MAX_TABLE {
                return Err(Malformed);
            }
            self.max_size = size;
            self.evict(0);
        } else {
            // Literal without indexing, or never indexed.
            if let Some(read) = self.literal(block, &mut pos, 4, false)? {
                timeout.get_or_insert(read);
            }
        }
        Ok(pos)
    }

    /// A literal field whose name index has a `prefix`-bit prefix: `Some`
    /// if it is a `grpc-timeout`, with its deadline if valid.
    ///
    /// Only what the shadow needs is decoded: a new name is compared in
    /// its coded form, a value is read only under `grpc-timeout`, and the
    /// decoded lengths are counted only for an entry the table keeps. The
    /// `:path` of every request, which encoders never index, is skipped
    /// unread.
    fn literal(
        &mut self,
        block: &[u8],
        pos: &mut usize,
        prefix: u8,
        indexed: bool,
    ) -> Result<Option<Option<Duration>>, Malformed> {
        let name_index = integer(block, pos, prefix)?;
        let (name_len, is_timeout) = if name_index == 0 {
            let name = Coded::read(block, pos)?;
            let is_timeout = name.is_grpc_timeout();
            let len = if indexed { name.decoded_len()? } else { 0 };
            (len, is_timeout)
        } else if let Some(entry) = self.dynamic(name_index)? {
            (entry.name_len, entry.is_timeout)
        } else {
            // A static name (the static table has no `grpc-timeout`).
            (STATIC_NAMES[name_index - 1].len(), false)
        };
        let value = Coded::read(block, pos)?;
        let (value_len, timeout) = if is_timeout {
            let mut kept = Kept::default();
            let len = value.decode(&mut kept)?;
            let timeout = kept
                .text()
                .and_then(|text| timeout_header::decode(text).ok());
            (len, timeout)
        } else if indexed {
            (value.decoded_len()?, None)
        } else {
            (0, None)
        };
        if indexed {
            self.insert(Entry {
                name_len,
                size: name_len + value_len + 32,
                is_timeout,
                timeout,
            });
        }
        Ok(is_timeout.then_some(timeout))
    }

    /// The dynamic entry at `index`; `None` for a static one.
    fn dynamic(&self, index: usize) -> Result<Option<&Entry>, Malformed> {
        match index {
            0 => Err(Malformed),
            1..=61 => Ok(None),
            _ => self.entries.get(index - 62).map(Some).ok_or(Malformed),
        }
    }

    fn insert(&mut self, entry: Entry) {
        if entry.size > self.max_size {
            // An entry larger than the table empties it (RFC 7541, 4.4).
            self.entries.clear();
            self.size = 0;
            self.timeout_mask = 0;
            return;
        }
        self.evict(entry.size);
        self.size += entry.size;
        self.timeout_mask = self.timeout_mask << 1 | u64::from(entry.is_timeout);
        self.entries.push_front(entry);
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.entries.pop_back() {
                Some(oldest) => {
                    self.size -= oldest.size;
                    // Its bit, if it had one: the one past the newest left.
                    if let Some(bit) = 1u64.checked_shl(self.entries.len() as u32) {
                        self.timeout_mask &= !bit;
                    }
                }
                None => break,
            }
        }
    }
}

/// The first bytes of a decoded string: enough for `grpc-timeout` and any
/// valid value of it.
#[derive(Debug, Default)]
struct Kept {
    bytes: [u8; 16],
    len: usize,
    /// More came than fit.
    over: bool,
}

impl Kept {
    fn push(&mut self, byte: u8) {
        match self.bytes.get_mut(self.len) {
            Some(slot) => {
                *slot = byte;
                self.len += 1;
            }
            None => self.over = true,
        }
    }

    fn text(&self) -> Option<&[u8]> {
        (!self.over).then_some(&self.bytes[..self.len])
    }
}

/// An integer with an `prefix`-bit prefix (RFC 7541, 5.1).
fn integer(block: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, Malformed> {
    let mask = (1u8 << prefix) - 1;
    let first = block.get(*pos).ok_or(Malformed)? & mask;
    *pos += 1;
    if first < mask {
        return Ok(usize::from(first));
    }
    let mut value = usize::from(mask);
    let mut shift = 0;
    loop {
        let byte = *block.get(*pos).ok_or(Malformed)?;
        *pos += 1;
        value += usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
        if shift > 21 {
            // Beyond any size a header block can hold.
            return Err(Malformed);
        }
    }
}

/// Where the field at `pos` ends, if it is a literal not indexed whose name
/// is the static table's (its index in one or two bytes, its value's
/// length in one): the usual such fields, passed over without a call.
#[inline]
fn static_literal(block: &[u8], pos: usize) -> Option<usize> {
    let (index, at) = match block.get(pos)? & 0x0f {
        0 => return None,
        0x0f => {
            let more = *block.get(pos + 1)?;
            (15 + usize::from(more), pos + 2)
        }
        index => (usize::from(index), pos + 1),
    };
    let len = *block.get(at)? & 0x7f;
    // A longer name index, or value length, takes the general path.
    (index <= 61 && len != 0x7f).then_some(at + 1 + usize::from(len))
}

/// A string literal (RFC 7541, 5.2) as it was sent: Huffman-coded or not.
#[derive(Debug, Clone, Copy)]
struct Coded<'a> {
    huffman: bool,
    raw: &'a [u8],
}

impl<'a> Coded<'a> {
    fn read(block: &'a [u8], pos: &mut usize) -> Result<Self, Malformed> {
        let huffman = block.get(*pos).ok_or(Malformed)? & 0x80 != 0;
        let len = integer(block, pos, 7)?;
        let raw = block.get(*pos..*pos + len).ok_or(Malformed)?;
        *pos += len;
        Ok(Self { huffman, raw })
    }

    /// Whether it reads `grpc-timeout`: a string has one Huffman coding
    /// (its padding is fixed), so the coded form is compared.
    fn is_grpc_timeout(&self) -> bool {
        if self.huffman {
            self.raw == GRPC_TIMEOUT_HUFFMAN.bytes()
        } else {
            self.raw == GRPC_TIMEOUT
        }
    }

    /// Its decoded length.
    fn decoded_len(&self) -> Result<usize, Malformed> {
        if !self.huffman {
            return Ok(self.raw.len());
        }
        let mut len = 0;
        huffman_decode(self.raw, |_| len += 1)?;
        Ok(len)
    }

    /// Its decoded length, its first bytes into `kept`.
    fn decode(&self, kept: &mut Kept) -> Result<usize, Malformed> {
        if !self.huffman {
            self.raw.iter().for_each(|&b| kept.push(b));
            return Ok(self.raw.len());
        }
        let mut len = 0;
        huffman_decode(self.raw, |b| {
            len += 1;
            kept.push(b);
        })?;
        Ok(len)
    }
}

/// The length in bits of the Huffman code of each symbol, 0 to 255 and
/// EOS (256), from RFC 7541, Appendix B. The code is canonical (codes of
/// one length are consecutive, in symbol order, after all shorter ones), so
/// the lengths alone make it.
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

/// The canonical code, by length: the first code of each length, how many
/// codes have it, and where its symbols start in `symbols`; and, for the
/// codes of up to 8 bits, which most text is made of, a table from the next
/// 8 bits to the symbol.
struct Canonical {
    first: [u32; 31],
    count: [u32; 31],
    start: [u16; 31],
    /// Symbols ordered by code.
    symbols: [u16; 257],
    /// Each symbol's code.
    codes: [u32; 257],
    /// By the next 8 bits: the symbol whose code of up to 8 bits starts
    /// them, and that code's length (`symbol | len << 9`); 0 where none does.
    short: [u16; 256],
}

const CANONICAL: Canonical = canonical();

const fn canonical() -> Canonical {
    let mut count = [0u32; 31];
    let mut i = 0;
    while i < 257 {
        count[CODE_LENGTHS[i] as usize] += 1;
        i += 1;
    }
    let mut first = [0u32; 31];
    let mut start = [0u16; 31];
    let mut symbols = [0u16; 257];
    let mut codes = [0u32; 257];
    let mut short = [0u16; 256];
    let mut code = 0u32;
    let mut next = 0usize;
    let mut len = 1;
    while len <= 30 {
        first[len] = code;
        start[len] = next as u16;
        let mut symbol = 0;
        let mut this = code;
        while symbol < 257 {
            if CODE_LENGTHS[symbol] as usize == len {
                symbols[next] = symbol as u16;
                codes[symbol] = this;
                if len <= 8 {
                    let shift = 8 - len;
                    let mut low = 0;
                    while low < (1 << shift) {
                        short[((this << shift) | low) as usize] =
                            symbol as u16 | ((len as u16) << 9);
                        low += 1;
                    }
                }
                this += 1;
                next += 1;
            }
            symbol += 1;
        }
        code = (code + count[len]) << 1;
        len += 1;
    }
    Canonical {
        first,
        count,
        start,
        symbols,
        codes,
        short,
    }
}

/// A short text in its Huffman coding.
struct HuffmanCoded {
    bytes: [u8; 32],
    len: usize,
}

impl HuffmanCoded {
    fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// `grpc-timeout`, Huffman-coded as an encoder sends it.
const GRPC_TIMEOUT_HUFFMAN: HuffmanCoded = huffman_encode(GRPC_TIMEOUT);

/// The Huffman coding of `text` (at most 32 bytes coded), padded with ones.
const fn huffman_encode(text: &[u8]) -> HuffmanCoded {
    let mut bytes = [0u8; 32];
    let mut len = 0;
    let mut bits: u64 = 0;
    let mut held = 0u32;
    let mut i = 0;
    while i < text.len() {
        let symbol = text[i] as usize;
        let code_len = CODE_LENGTHS[symbol] as u32;
        bits = (bits << code_len) | CANONICAL.codes[symbol] as u64;
        held += code_len;
        while held >= 8 {
            held -= 8;
            bytes[len] = (bits >> held) as u8;
            len += 1;
        }
        i += 1;
    }
    if held > 0 {
        let pad = 8 - held;
        bytes[len] = ((bits << pad) as u8) | ((1u8 << pad) - 1);
        len += 1;
    }
    HuffmanCoded { bytes, len }
}

/// Decodes a Huffman-coded string, each byte to `out` (RFC 7541, 5.2):
/// the string ends in at most 7 bits of padding, all ones; EOS inside it is
/// an error.
fn huffman_decode(raw: &[u8], mut out: impl FnMut(u8)) -> Result<(), Malformed> {
    let mut bits: u64 = 0;
    let mut held = 0u32;
    let mut next = 0;
    loop {
        while held <= 48 && next < raw.len() {
            bits = (bits << 8) | u64::from(raw[next]);
            held += 8;
            next += 1;
        }
        if held >= 8 {
            // A code of up to 8 bits, by table.
            let entry = CANONICAL.short[((bits >> (held - 8)) & 0xff) as usize];
            if entry != 0 {
                held -= u32::from(entry >> 9);
                bits &= (1 << held) - 1;
                out((entry & 0x1ff) as u8);
                continue;
            }
        }
        // Past the table, a longer code (or, with fewer than 8 bits
        // left, the last short one and the padding).
        let mut len = if held >= 8 { 9 } else { 5 };
        let mut symbol = None;
        while len <= 30 && len <= held {
            let code = ((bits >> (held - len)) & ((1 << len) - 1)) as u32;
            let offset = code.wrapping_sub(CANONICAL.first[len as usize]);
            if offset < CANONICAL.count[len as usize] {
                let at = CANONICAL.start[len as usize] as usize + offset as usize;
                symbol = Some((CANONICAL.symbols[at], len));
                break;
            }
            len += 1;
        }
        match symbol {
            Some((256, _)) => return Err(Malformed),
            Some((byte, len)) => {
                held -= len;
                bits &= (1 << held) - 1;
                out(byte as u8);
            }
            // No code in what is left: it must be the padding.
            None if next == raw.len() && held < 8 && bits == (1 << held) - 1 => return Ok(()),
            None => return Err(Malformed),
        }
    }
}

/// The names of HPACK's static table (RFC 7541, Appendix A), from index 1.
const STATIC_NAMES: [&str; 61] = [
    ":authority",
    ":method",
    ":method",
    ":path",
    ":path",
    ":scheme",
    ":scheme",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    ":status",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "accept",
    "access-control-allow-origin",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-range",
    "content-type",
    "cookie",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "link",
    "location",
    "max-forwards",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "refresh",
    "retry-after",
    "server",
    "set-cookie",
    "strict-transport-security",
    "transfer-encoding",
    "user-agent",
    "vary",
    "via",
    "www-authenticate",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The code of `symbol`, rebuilt from the lengths.
    fn code_of(symbol: usize) -> (u32, u8) {
        let len = CODE_LENGTHS[symbol];
        let c = &CANONICAL;
        let at = c
            .symbols
            .iter()
            .position(|&s| s as usize == symbol)
            .expect("a symbol");
        let offset = at as u32 - u32::from(c.start[len as usize]);
        (c.first[len as usize] + offset, len)
    }

    #[test]
    fn the_code_rebuilt_from_its_lengths_is_the_rfcs() {
        // RFC 7541, Appendix B.
        assert_eq!(code_of(usize::from(b'0')), (0x0, 5));
        assert_eq!(code_of(usize::from(b'a')), (0x3, 5));
        assert_eq!(code_of(usize::from(b' ')), (0x14, 6));
        assert_eq!(code_of(usize::from(b'z')), (0x7b, 7));
        assert_eq!(code_of(0), (0x1ff8, 13));
        assert_eq!(code_of(255), (0x3ffffee, 26));
        assert_eq!(code_of(256), (0x3fffffff, 30), "EOS");
    }

    #[test]
    fn grpc_timeout_is_compared_in_its_huffman_coding() {
        let coded = GRPC_TIMEOUT_HUFFMAN.bytes();
        let mut out = Vec::new();
        huffman_decode(coded, |b| out.push(b)).expect("valid");
        assert_eq!(out, GRPC_TIMEOUT);
        // RFC 7541, C.4.3.
        assert_eq!(
            huffman_encode(b"custom-key").bytes(),
            [0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f]
        );
        assert_eq!(
            huffman_encode(b"custom-value").bytes(),
            [0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf]
        );
    }

    #[test]
    fn every_byte_decodes_through_the_table_and_past_it() {
        // Every symbol, after each of a few prefixes, so that long codes
        // meet the table at every bit offset.
        for prefix in [&b""[..], b"a", b"ab", b"abc", b"%"] {
            for symbol in 0..=255u8 {
                let mut text = prefix.to_vec();
                text.push(symbol);
                text.extend_from_slice(b"x");
                let coded = huffman_encode(&text);
                let mut out = Vec::new();
                huffman_decode(coded.bytes(), |b| out.push(b)).expect("valid");
                assert_eq!(out, text);
            }
        }
    }

    #[test]
    fn huffman_strings_of_the_rfc_decode() {
        // RFC 7541, C.4.1 and C.4.3.
        let www = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        let mut out = Vec::new();
        huffman_decode(&www, |b| out.push(b)).expect("valid");
        assert_eq!(out, b"www.example.com");
        let custom = [0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf];
        out.clear();
        huffman_decode(&custom, |b| out.push(b)).expect("valid");
        assert_eq!(out, b"custom-value");
        // Padding of more than 7 bits, or not all ones, is an error.
        assert_eq!(huffman_decode(&[0xff, 0xff], |_| {}), Err(Malformed));
        assert_eq!(huffman_decode(&[0x1e], |_| {}), Err(Malformed));
    }

    #[test]
    fn the_rfcs_request_blocks_fill_the_table_as_the_rfc_says() {
        // RFC 7541, C.4: three requests with Huffman coding; after the
        // third, the table holds 3 entries of 164 bytes.
        let blocks: [&[u8]; 3] = [
            &[
                0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
                0x90, 0xf4, 0xff,
            ],
            &[
                0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
            ],
            &[
                0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f,
                0x89, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
            ],
        ];
        let mut shadow = Shadow::default();
        for block in blocks {
            assert_eq!(shadow.decode(block), Ok(None));
        }
        assert_eq!(shadow.entries.len(), 3);
        assert_eq!(shadow.size, 164);
    }

    #[test]
    fn a_grpc_timeout_is_read_literal_indexed_and_from_the_table() {
        let mut shadow = Shadow::default();
        // Literal with incremental indexing, new name, plain text.
        let mut block = vec![0x40, 12];
        block.extend_from_slice(b"grpc-timeout");
        block.push(5);
        block.extend_from_slice(b"1000m");
        assert_eq!(shadow.decode(&block), Ok(Some(Duration::from_secs(1))));
        // The same header again, indexed from the table.
        assert_eq!(shadow.decode(&[0xbe]), Ok(Some(Duration::from_secs(1))));
        // A new value under the indexed name, without indexing.
        let mut block = vec![0x0f, 62 - 15];
        block.push(2);
        block.extend_from_slice(b"5S");
        assert_eq!(shadow.decode(&block), Ok(Some(Duration::from_secs(5))));
        // A value that is not a valid grpc-timeout reads as none.
        let mut block = vec![0x0f, 62 - 15];
        block.push(2);
        block.extend_from_slice(b"1a");
        assert_eq!(shadow.decode(&block), Ok(None));
        // A `:path` without indexing, Huffman-coded as encoders send it,
        // is passed over, and the table entry after it still found.
        let path = huffman_encode(b"/grpc.health.v1.Health/Check");
        let mut block = vec![0x04, 0x80 | path.len as u8];
        block.extend_from_slice(path.bytes());
        block.push(0xbe);
        assert_eq!(shadow.decode(&block), Ok(Some(Duration::from_secs(1))));
        // So is a `content-type` (static index 31, in two bytes) without
        // indexing.
        let mut block = vec![0x0f, 31 - 15, 16];
        block.extend_from_slice(b"application/grpc");
        block.push(0xbe);
        assert_eq!(shadow.decode(&block), Ok(Some(Duration::from_secs(1))));
        // One whose value runs past the block is malformed.
        assert_eq!(shadow.decode(&[0x0f, 31 - 15, 16, b'a']), Err(Malformed));
    }

    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = (String, String)> {
        let name = prop_oneof![
            Just("grpc-timeout".to_owned()),
            Just("content-type".to_owned()),
            Just(":path".to_owned()),
            "[a-z-]{1,20}",
        ];
        let value = prop_oneof![
            (1u32..99_999_999, "[HMSmun]").prop_map(|(n, u)| format!("{n}{u}")),
            "[ -~]{0,40}",
        ];
        (name, value)
    }

    proptest! {
        #[test]
        fn the_shadow_reads_what_a_real_encoder_wrote(
            blocks in proptest::collection::vec(proptest::collection::vec(header(), 0..8), 1..30)
        ) {
            // loona-hpack's encoder indexes every header it can, and
            // Huffman-codes what is shorter so: the table fills, entries
            // are evicted, and names are referred to by index.
            let mut encoder = loona_hpack::Encoder::new();
            let mut shadow = Shadow::default();
            for headers in &blocks {
                let block = encoder.encode(
                    headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())),
                );
                let expected = headers
                    .iter()
                    .find(|(n, _)| n == "grpc-timeout")
                    .and_then(|(_, v)| timeout_header::decode(v.as_bytes()).ok());
                prop_assert_eq!(shadow.decode(&block), Ok(expected));
            }
        }

        #[test]
        fn any_bytes_are_followed_or_malformed_never_a_panic(
            block in proptest::collection::vec(any::<u8>(), 0..64)
        ) {
            let _ = Shadow::default().decode(&block);
            let _ = huffman_decode(&block, |_| {});
        }
    }

    #[test]
    fn truncated_or_impossible_blocks_are_malformed_and_never_panic() {
        let mut shadow = Shadow::default();
        // An index out of the table is the connection's decoder's to
        // refuse: while the table holds no `grpc-timeout`, it is passed over.
        assert_eq!(shadow.decode(&[0x80]), Ok(None), "index 0");
        assert_eq!(shadow.decode(&[0xbe]), Ok(None), "an empty dynamic table");
        for block in [
            &[0x40, 0x05, b'a'][..],   // a name cut short
            &[0x3f, 0xff, 0xff, 0x7f], // a table larger than allowed
            &[0x7f, 0xff, 0xff, 0xff, 0xff, 0x7f],
        ] {
            assert_eq!(shadow.decode(block), Err(Malformed), "{block:?}");
        }
    }
}
