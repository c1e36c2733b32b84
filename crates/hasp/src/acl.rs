//! The least a Redis ACL user needs to be a hasp client.

/// The ACL rules (`ACL SETUSER <user> on ><password> …`, or a line of an
/// ACL file after `user <name> on >…`) that let a user be a hasp client
/// whose keys and channels start with `prefix` (`Settings::set_prefix`,
/// `"hasp"` by default), and nothing else: its keys (`~prefix:*`) and
/// channels (`&prefix:*`) only; the batch function's library (`FCALL`,
/// `FUNCTION LOAD`) and the small native scripts (`EVALSHA`, `SCRIPT
/// LOAD`); the commands the function and the scripts run; the native
/// commands of Valkey 9 and the read-only queries; pub/sub (sharded on a
/// cluster); `WAIT` for replica acknowledgement; `CLUSTER SLOTS` on a
/// cluster; and what a connection says when it opens (`HELLO`, `AUTH`,
/// `SELECT`, `CLIENT SETNAME`, `COMMAND INFO`, `PING`, `ECHO`).
///
/// The rules name Redis 7.0's commands, and are enough on Valkey 9 too:
/// there a client whose user may not send `DELIFEQ` releases by a small
/// script instead (it tries, on a key of its prefix no lock uses, when it
/// connects). Add `+delifeq` on Valkey 9 to release natively (`SET …
/// IFEQ` is `SET`).
///
/// A command the rules leave out is refused by Redis with `NOPERM`, which
/// the client answers as an error at once ([`Error::Redis`](crate::Error::Redis)),
/// never retried.
///
/// ```
/// let rules = hasp::acl_rules("hasp");
/// assert!(rules.starts_with("resetkeys ~hasp:* resetchannels &hasp:* -@all"));
/// // ACL SETUSER locks on >secret <rules>
/// ```
pub fn acl_rules(prefix: &str) -> String {
    let commands = [
        // The batch function and the native scripts.
        "+fcall",
        "+function|load",
        "+evalsha",
        "+script|load",
        "+script|exists",
        // What they run, and the native commands and queries.
        "+get",
        "+set",
        "+del",
        "+incr",
        "+exists",
        "+pttl",
        "+pexpire",
        "+pexpireat",
        "+persist",
        "+time",
        "+hget",
        "+hmget",
        "+hset",
        "+hdel",
        "+hexists",
        "+hincrby",
        "+sadd",
        "+zadd",
        "+zrem",
        "+zcard",
        "+zrank",
        "+zscore",
        "+zrange",
        "+zrangebyscore",
        // Release messages.
        "+publish",
        "+spublish",
        "+subscribe",
        "+unsubscribe",
        "+ssubscribe",
        "+sunsubscribe",
        // Replica acknowledgement, a cluster's map.
        "+wait",
        "+cluster|slots",
        // Opening a connection.
        "+hello",
        "+auth",
        "+select",
        "+client|setname",
        "+command|info",
        "+ping",
        "+echo",
    ];
    format!(
        "resetkeys ~{prefix}:* resetchannels &{prefix}:* -@all {}",
        commands.join(" ")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_readme_shows_the_rules_for_the_default_prefix() {
        let readme = include_str!("../README.md");
        assert!(
            readme.contains(&super::acl_rules("hasp")),
            "the README's ACL rules differ from acl_rules(\"hasp\")"
        );
    }
}
