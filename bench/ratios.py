"""The ratios of bench/throughput.py's run: figures of one run divided by each other.

Rates drift with the machine's load; ratios of cases run next to each other hold better. Each ratio
appears only when both of its figures are in the run.
"""
import functools

from bench import cpp_cases
from bench.harness import key


def ratios(result):
    """Every ratio the figures in `result` allow: floor, echo, bare, transport, client and C++ ones."""
    out = floor_ratios(result)
    out.update(echo_ratios(result))
    out.update(cpp_cases.ratios(result))
    return out


def floor_ratios(result):
    """The lockstep cases over the bare grpcio round trip: *_vs_floor, stream_vs_stream_floor."""
    out = {}
    floor = result.get("grpc_floor_roundtrips_per_s")
    if floor:
        for prefix in ("stream", "unary"):
            rate = result.get(f"{prefix}_lockstep_steps_per_s")
            if rate is not None:
                out[f"{prefix}_vs_floor"] = round(rate / floor, 3)
        sfloor = result.get("grpc_floor_stream_roundtrips_per_s")
        if sfloor and "stream_lockstep_steps_per_s" in result:
            out["stream_vs_stream_floor"] = round(result["stream_lockstep_steps_per_s"] / sfloor, 3)
    return out


def echo_ratios(result):
    """Each Step case against the bare stream echo of its message sizes on the same transport
    (*_vs_echo: calls per second over echo round trips per second), and UDS against TCP."""
    out = {}
    for net in ("tcp", "uds", "shm"):
        k = functools.partial(key, net)
        for case, n, rate in (("step_lockstep", 1, "steps_per_s"), ("batched64", 64, "calls_per_s"),
                              ("batched256", 256, "calls_per_s")):
            echo, got = result.get(k(f"echo_step{n}_roundtrips_per_s")), result.get(k(f"{case}_{rate}"))
            if echo and got:
                out[k(f"{case}_vs_echo")] = round(got / echo, 3)
            bare = result.get(k(f"bare_step{n}_{rate}"))
            if bare and got:
                out[k(f"{case}_vs_bare")] = round(got / bare, 3)
                # the bare client steps no simulator: the same ratio with the env's step time left out
                env_us = result.get(k(f"{case}_env_step_us"))
                if env_us:
                    out[k(f"{case}_vs_bare_without_env")] = round(1 / (1 / got - env_us * 1e-6) / bare, 3)
        echo, got = result.get(k("grpc_floor_stream_roundtrips_per_s")), result.get(k("stream_lockstep_steps_per_s"))
        if echo and got:
            out[k("stream_lockstep_vs_echo")] = round(got / echo, 3)
    for name in ("stream_lockstep_steps_per_s", "step_lockstep_steps_per_s", "batched64_agent_steps_per_s",
                 "batched256_agent_steps_per_s"):
        if result.get(name) and result.get(f"iter_{name}"):
            out[f"direct_vs_iterator_{name}"] = round(result[name] / result[f"iter_{name}"], 3)
    for name in ("grpc_floor_stream_roundtrips_per_s", "echo_step1_roundtrips_per_s", "stream_lockstep_steps_per_s",
                 "step_lockstep_steps_per_s", "batched64_agent_steps_per_s", "batched256_agent_steps_per_s"):
        for net in ("uds", "shm", "spin_shm", "cspin_shm"):
            if result.get(name) and result.get(f"{net}_{name}"):
                out[f"{net}_vs_tcp_{name}"] = round(result[f"{net}_{name}"] / result[name], 3)
        if result.get(f"uds_{name}") and result.get(f"shm_{name}"):
            out[f"shm_vs_uds_{name}"] = round(result[f"shm_{name}"] / result[f"uds_{name}"], 3)
    out.update(free_bridge_ceilings(result))
    return out


def free_bridge_ceilings(result):
    """shm_vs_tcp_<figure>_free_bridge_ceiling: the most a shared-memory case could make of this
    simulator over TCP's figure of the same run, were the bridge's Step free. A lockstep Step is
    serial, so none is shorter than the simulator's own CPU per Step (its env and client, measured
    in the case) plus what the bare ring echo of the same sizes spends beyond its client (the
    wake-ups and the peer's copy). Over 1 means no server work could close the gap."""
    out = {}
    for case, n, figure in (("step_lockstep", 1, "step_lockstep_steps_per_s"),
                            ("batched64", 64, "batched64_agent_steps_per_s"),
                            ("batched256", 256, "batched256_agent_steps_per_s")):
        client_us = result.get(f"shm_{case}_client_cpu_us_per_call")
        echo = result.get(f"shm_echo_step{n}_roundtrips_per_s")
        echo_client_us = result.get(f"shm_echo_step{n}_client_cpu_us_per_call")
        tcp = result.get(figure)
        if client_us and echo and echo_client_us is not None and tcp:
            floor_us = client_us + max(0.0, 1e6 / echo - echo_client_us)
            out[f"shm_vs_tcp_{figure}_free_bridge_ceiling"] = round(1e6 / floor_us * n / tcp, 3)
    return out

