//! `syscalls:sys_exit_accept{,4}`: the format field its program reads. Its records are
//! `inet_csk_accept` events.

use drainwatch_common::sys_exit_accept::Fields;

use crate::capture::tracefs::Resolver;

/// Records decode as `inet_csk_accept` events (the program emits that type).
pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.ret = r.required("ret", 8);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::tracefs::Format;

    #[test]
    fn reads_the_return_value_offset() {
        // /sys/kernel/tracing/events/syscalls/sys_exit_accept4/format on 6.18.
        let fmt = Format::parse(
            "name: sys_exit_accept4\nID: 2233\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n",
        )
        .unwrap();
        let mut r = Resolver::new(&fmt);
        assert_eq!(fields(&mut r).ret, 16);
        assert!(r.missing_required.is_empty());
    }
}
