//! The listen-path counters of a network namespace from `/proc/<pid>/net/netstat`.
//! Hand-written: the procfs crate parses `snmp` and `snmp6` but not `netstat`.
//!
//! `ListenOverflows` counts SYNs and handshake-completing ACKs dropped because a listener's
//! accept queue was full, including the ones the kernel frees without a drop reason
//! (`skb:kfree_skb` never sees those); `ListenDrops` counts every drop on the listen path.

pub use crate::model::ListenCounters;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetstatError {
    #[error("no TcpExt header and value lines")]
    NoTcpExt,
    #[error("TcpExt has no {0} column")]
    Missing(&'static str),
    #[error("TcpExt {name} is not a number: {value:?}")]
    NotANumber { name: &'static str, value: String },
}

/// Parses the `TcpExt:` header/value line pair of a netstat file.
pub fn parse_listen_counters(text: &str) -> Result<ListenCounters, NetstatError> {
    let mut tcpext = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (tcpext.next(), tcpext.next()) else {
        return Err(NetstatError::NoTcpExt);
    };
    let names: Vec<&str> = names.split_whitespace().skip(1).collect();
    let values: Vec<&str> = values.split_whitespace().skip(1).collect();
    let get = |name: &'static str| -> Result<u64, NetstatError> {
        let i = names
            .iter()
            .position(|n| *n == name)
            .ok_or(NetstatError::Missing(name))?;
        let v = values.get(i).ok_or(NetstatError::Missing(name))?;
        v.parse().map_err(|_| NetstatError::NotANumber {
            name,
            value: v.to_string(),
        })
    };
    Ok(ListenCounters {
        overflows: get("ListenOverflows")?,
        drops: get("ListenDrops")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: &str = include_str!("../../fixtures/procfs/netstat-6.18.txt");

    #[test]
    fn reads_the_listen_counters_of_a_real_file() {
        let c = parse_listen_counters(REAL).unwrap();
        // The fixture's values, read with awk when it was taken.
        let col = |name: &str| {
            let mut l = REAL.lines().filter(|l| l.starts_with("TcpExt:"));
            let (n, v) = (l.next().unwrap(), l.next().unwrap());
            let i = n.split_whitespace().position(|x| x == name).unwrap();
            v.split_whitespace().nth(i).unwrap().parse::<u64>().unwrap()
        };
        assert_eq!(
            c,
            ListenCounters {
                overflows: col("ListenOverflows"),
                drops: col("ListenDrops"),
            }
        );
        assert!(c.drops >= c.overflows, "every overflow is also a drop");
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert_eq!(parse_listen_counters(""), Err(NetstatError::NoTcpExt));
        assert_eq!(
            parse_listen_counters("TcpExt: A B\nTcpExt: 1 2\n"),
            Err(NetstatError::Missing("ListenOverflows"))
        );
        assert_eq!(
            parse_listen_counters("TcpExt: ListenOverflows ListenDrops\nTcpExt: 3\n"),
            Err(NetstatError::Missing("ListenDrops"))
        );
        assert!(matches!(
            parse_listen_counters("TcpExt: ListenOverflows ListenDrops\nTcpExt: x 1\n"),
            Err(NetstatError::NotANumber { .. })
        ));
        assert_eq!(
            parse_listen_counters("TcpExt: ListenOverflows ListenDrops\nTcpExt: 3 5\n"),
            Ok(ListenCounters {
                overflows: 3,
                drops: 5
            })
        );
    }
}
