// The dense peak throughput of known GPUs, by the math their GEMMs run in: what model FLOP
// utilization (MFU) divides the achieved model FLOP/s by, as Megatron-LM and torchtitan report
// it. Figures from NVIDIA's data sheets, without structured sparsity. A CPU's peak depends on
// clocks no program can read reliably under a hypervisor: give it with --peak-tflops.
#pragma once

#include <optional>
#include <string_view>

namespace mlptrain {

enum class GemmMath { fp32, tf32, half };  // half: bf16 or fp16 inputs on tensor cores

// The GPU's peak TFLOP/s for `math`, when `device_name` (the driver's) is a model in the table.
std::optional<double> known_peak_tflops(std::string_view device_name, GemmMath math);

}  // namespace mlptrain
