#!/usr/bin/python3
"""ZeRO's speed and memory benchmark, measured side by side in one run:

  * at 2 ranks on the foundation's model (10 layers, width 1024, batch 256 per rank): the step
    time of ZeRO stages 1, 2 and 3 against plain data parallelism (stage 0), interleaved over
    --rounds rounds, medians;
  * at 4 ranks (oversubscribed on 2 cores: memory is the point): every rank's peak model-state
    memory (params + grads + optimizer) per stage, and the unit buffers in flight (comm_buffers).

Writes results/zero.json."""
import statistics

from benchlib import arguments, train as train_run, write_result

MODEL = ["--dataset", "mixture", "--layers", "10", "--hidden", "1024", "--input-dim", "1024",
         "--output-dim", "10"]


def train(ranks, stage, steps):
    return train_run(ranks, MODEL + ["--global-batch", 256 * ranks, "--steps", steps, "--zero", stage],
                     f"zero-{ranks}-{stage}")


def main():
    args = arguments(__doc__, rounds=3, steps=12, result_file="zero.json").parse_args()

    times = {stage: [] for stage in range(4)}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds} (2 ranks)", flush=True)
        for stage in range(4):
            times[stage].append(train(2, stage, args.steps)[0])
    memory = {}
    for stage in range(4):
        print(f"bench: memory of stage {stage} at 4 ranks", flush=True)
        _, summary = train(4, stage, 2)
        memory[stage] = [{"model_state": peaks["params"] + peaks["grads"] + peaks["optimizer"],
                          "comm_buffers": peaks["comm_buffers"], **peaks}
                         for peaks in summary["peak_mem_bytes_by_rank"]]
    step_ms = {stage: statistics.median(values) for stage, values in times.items()}
    largest = {stage: max(rank["model_state"] for rank in memory[stage]) for stage in memory}
    result = {
        "step_ms_2_ranks": step_ms,
        "step_time_over_plain_dp": {stage: step_ms[stage] / step_ms[0] for stage in (1, 2, 3)},
        "model_state_bytes_4_ranks": largest,
        "model_state_over_plain_dp_4_ranks": {stage: largest[stage] / largest[0] for stage in (1, 2, 3)},
        "memory_by_rank_4_ranks": memory,
        "targets": {"stage 1 and 2 step time over plain DP": "<= 1.05",
                    "stage 3 step time over plain DP": "<= 1.25",
                    "stage 3 model state over plain DP at 4 ranks": "<= 0.30"},
        "samples": times,
    }
    write_result(args.output, result)
    for stage in (1, 2, 3):
        print(f"stage {stage}: step time {result['step_time_over_plain_dp'][stage]:.3f} x plain DP, "
              f"model state at 4 ranks {result['model_state_over_plain_dp_4_ranks'][stage]:.3f} x plain DP "
              f"(+ {memory[stage][0]['comm_buffers'] / 2**20:.1f} MiB of unit buffers)")


if __name__ == "__main__":
    main()
