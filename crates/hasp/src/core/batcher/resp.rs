//! RESP2 on the batcher's own connection: commands packed straight into
//! its buffer, replies read out of the bytes it has received.
//!
//! The batcher's connection speaks RESP2 whatever the client's protocol
//! setting (its replies are the same in both), so five reply types are all
//! there is: simple strings, errors, integers, bulk strings and arrays.
//! Error lines are handed to redis-rs's own parser, so that an error reply
//! carries the same kind (`NOSCRIPT`, `READONLY`, `MOVED`, ...) as on any
//! redis-rs connection; everything else is read here, without the
//! per-reply state machine a general streaming parser keeps.
//!
//! A command is an array of bulk strings. [`Packer`] writes one argument
//! at a time into the buffer it is given (a native command's, as `wire`
//! gives them: [`pack`]), so a command sent this way costs no allocation of
//! its own (a `redis::Cmd` keeps its arguments in two vectors, then is
//! copied into the buffer).

use redis::{RedisError, RedisResult, Value};

use crate::core::wire::native::{Args, NativeCommand};

/// Nesting deeper than this is not a reply hasp asked for.
const MAX_DEPTH: usize = 8;

/// Writes one command into a buffer: the array header when made, then
/// each argument. The command is whole once it has as many arguments as
/// it announced.
pub(crate) struct Packer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Packer<'a> {
    /// Starts a command of `args` arguments (its name included) at the end
    /// of `out`.
    pub(crate) fn command(out: &'a mut Vec<u8>, args: usize) -> Self {
        out.push(b'*');
        out.extend_from_slice(itoa::Buffer::new().format(args).as_bytes());
        out.extend_from_slice(b"\r\n");
        Self { out }
    }
}

impl Args for Packer<'_> {
    fn joined(&mut self, parts: &[&[u8]]) -> &mut Self {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.out.reserve(len + 16);
        self.out.push(b'$');
        self.out
            .extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
        self.out.extend_from_slice(b"\r\n");
        for part in parts {
            self.out.extend_from_slice(part);
        }
        self.out.extend_from_slice(b"\r\n");
        self
    }
}

/// Packs `command` at the end of `out` (the connection's buffer).
pub(crate) fn pack(command: &NativeCommand<'_>, out: &mut Vec<u8>) {
    command.write_args(&mut Packer::command(out, command.arg_count()));
}

/// The first complete reply at the start of `buf` and the bytes it took;
/// `None` while it has not all arrived.
pub(crate) fn read(buf: &[u8]) -> RedisResult<Option<(Value, usize)>> {
    reply(buf, 0, 0)
}

fn reply(buf: &[u8], at: usize, depth: usize) -> RedisResult<Option<(Value, usize)>> {
    let Some(line_end) = line_end(buf, at) else {
        return Ok(None);
    };
    let next = line_end + 2;
    let line = &buf[at + 1..line_end];
    let value = match buf[at] {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8_lossy(line).into_owned()),
        b'-' => redis::parse_redis_value(&buf[at..next])?,
        b':' => Value::Int(number(line)?),
        b'$' => {
            let Ok(len) = usize::try_from(number(line)?) else {
                return Ok(Some((Value::Nil, next)));
            };
            let end = next + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(malformed("a bulk string longer than announced"));
            }
            return Ok(Some((Value::BulkString(buf[next..end].to_vec()), end + 2)));
        }
        b'*' => {
            let Ok(count) = usize::try_from(number(line)?) else {
                return Ok(Some((Value::Nil, next)));
            };
            if depth >= MAX_DEPTH {
                return Err(malformed("arrays nested too deep"));
            }
            // Each element takes at least three bytes: a count larger than
            // what could follow is not allocated for up front.
            let mut items = Vec::with_capacity(count.min(buf.len().saturating_sub(next) / 3));
            let mut at = next;
            for _ in 0..count {
                let Some((item, after)) = reply(buf, at, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at = after;
            }
            return Ok(Some((Value::Array(items), at)));
        }
        _ => return Err(malformed("an unknown reply type")),
    };
    Ok(Some((value, next)))
}

/// Where the line starting at `at` ends (the index of its `\r\n`).
fn line_end(buf: &[u8], at: usize) -> Option<usize> {
    let from = at + 1;
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| from + i)
}

fn number(line: &[u8]) -> RedisResult<i64> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("a number that is not one"))
}

/// A reply that is not RESP2: the connection cannot be trusted any more.
fn malformed(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("the server sent {what}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        let (value, used) = read(bytes).unwrap().expect("complete");
        assert_eq!(used, bytes.len(), "took the whole reply");
        value
    }

    #[test]
    fn every_native_command_packs_as_many_arguments_as_it_announces() {
        use crate::core::holds::Written;
        use crate::core::nonce::Nonces;
        let nonces = Nonces::new();
        let owner = hasp_owner::Owner::from_id("o 1").unwrap();
        let written = Written {
            nonce: nonces.next(),
            token: 7,
        };
        let commands = [
            NativeCommand::Acquire {
                lock: "hasp:{a}",
                owner: &owner,
                nonce: nonces.next(),
                lease_ms: 500,
                fenced: true,
            },
            NativeCommand::Acquire {
                lock: "hasp:{a}:plain",
                owner: &owner,
                nonce: nonces.next(),
                lease_ms: 500,
                fenced: false,
            },
            NativeCommand::DeleteIfEqual {
                lock: "hasp:{a}",
                owner: &owner,
                written,
                script: true,
            },
            NativeCommand::DeleteIfEqual {
                lock: "hasp:{a}",
                owner: &owner,
                written,
                script: false,
            },
            NativeCommand::SetIfEqual {
                lock: "hasp:{a}",
                owner: &owner,
                written,
                lease_ms: 500,
            },
        ];
        let mut out = Vec::new();
        for command in &commands {
            pack(command, &mut out);
        }
        let mut at = 0;
        for command in &commands {
            let (value, used) = read(&out[at..]).unwrap().expect("whole");
            let Value::Array(args) = value else {
                panic!("a command: {value:?}")
            };
            assert_eq!(args.len(), command.arg_count(), "{command:?}");
            at += used;
        }
        assert_eq!(at, out.len(), "nothing else packed");
    }

    #[test]
    fn a_packed_command_is_what_redis_rs_packs() {
        let mut out = b"left alone".to_vec();
        Packer::command(&mut out, 4)
            .arg(b"SET")
            .joined(&[b"a", b"", b"\r\nb"])
            .number(1500)
            .arg(b"");
        let mut cmd = redis::cmd("SET");
        cmd.arg("a\r\nb").arg(1500).arg("");
        assert_eq!(out[..10], *b"left alone");
        assert_eq!(out[10..], cmd.get_packed_command());
    }

    #[test]
    fn reads_each_reply_type() {
        assert_eq!(whole(b"+OK\r\n"), Value::Okay);
        assert_eq!(whole(b"+PONG\r\n"), Value::SimpleString("PONG".to_owned()));
        assert_eq!(whole(b":-42\r\n"), Value::Int(-42));
        assert_eq!(whole(b"$-1\r\n"), Value::Nil);
        assert_eq!(whole(b"*-1\r\n"), Value::Nil);
        assert_eq!(whole(b"$0\r\n\r\n"), Value::BulkString(Vec::new()));
        assert_eq!(
            whole(b"$4\r\na\r\nb\r\n"),
            Value::BulkString(b"a\r\nb".to_vec())
        );
        assert_eq!(
            whole(b"*3\r\n:1\r\n$1\r\nx\r\n*1\r\n$-1\r\n"),
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"x".to_vec()),
                Value::Array(vec![Value::Nil]),
            ])
        );
    }

    #[test]
    fn errors_carry_redis_rs_kinds() {
        let Value::ServerError(e) = whole(b"-NOSCRIPT No matching script\r\n") else {
            panic!("an error value");
        };
        assert_eq!(e.kind(), Some(redis::ServerErrorKind::NoScript));
        let Value::ServerError(e) = whole(b"-READONLY You can't write\r\n") else {
            panic!("an error value");
        };
        assert_eq!(e.kind(), Some(redis::ServerErrorKind::ReadOnly));
        // Inside an array (a pipeline's or a function's reply) too.
        let Value::Array(items) = whole(b"*2\r\n:1\r\n-ERR Function not found\r\n") else {
            panic!("an array");
        };
        assert!(matches!(items[1], Value::ServerError(_)));
    }

    #[test]
    fn waits_for_the_rest_at_every_cut() {
        let reply = b"*2\r\n$5\r\nhello\r\n*2\r\n:7\r\n-ERR no\r\n:9\r\n";
        let first = reply.len() - 4;
        for cut in 0..first {
            assert_eq!(read(&reply[..cut]).unwrap(), None, "cut at {cut}");
        }
        let (value, used) = read(reply).unwrap().unwrap();
        assert_eq!(used, first, "stops after the first reply");
        assert!(matches!(value, Value::Array(ref items) if items.len() == 2));
        assert_eq!(read(&reply[used..]).unwrap(), Some((Value::Int(9), 4)));
    }

    #[test]
    fn refuses_what_is_not_resp2() {
        for bad in [
            &b"?what\r\n"[..],
            b":12x\r\n",
            b"$3\r\nabcd\r\n",
            b"%1\r\n:1\r\n:2\r\n",
        ] {
            let e = read(bad).expect_err("malformed");
            assert_eq!(e.kind(), redis::ErrorKind::Io, "{e}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(read(deep.as_bytes()).is_err());
        // A huge announced count allocates nothing before its items come.
        assert_eq!(read(b"*4000000000\r\n").unwrap(), None);
    }
}
