//! Reading callgrind's output format, as `bench instructions` does.

use deadline_lab::bench::instructions::self_cost_in;

#[test]
fn self_cost_follows_compressed_object_names_and_skips_call_costs() {
    let out = "positions: line\nevents: Ir\n\
               ob=(1) /bin/lab\nfn=(1) main\n10 100\n\
               cob=(2) /usr/lib/faketime/libfaketime.so.1\ncfn=(2) clock_gettime\ncalls=3 0\n11 900\n\
               ob=(2)\nfn=(2)\n0 300\n+1 20\n\
               ob=(1)\nfn=(1)\n12 5\n";
    assert_eq!(
        self_cost_in(out, "libfaketime"),
        320,
        "only the self cost inside libfaketime must count, not the call cost charged to main"
    );
    assert_eq!(
        self_cost_in(out, "/bin/lab"),
        105,
        "main's own lines must add up"
    );
}
