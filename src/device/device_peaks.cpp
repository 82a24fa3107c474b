// The table of known GPUs' peaks (see device_peaks.hpp).
#include "device/device_peaks.hpp"

#include <array>

namespace mlptrain {

namespace {

struct DevicePeak {
  std::string_view name;  // a part of the driver's name; the first entry that matches wins
  double fp32, tf32, half;
};

// More specific names first: "H100 PCIe" before "H100".
constexpr std::array<DevicePeak, 7> peaks = {{
    {"H100 PCIe", 51.2, 378.0, 756.0},
    {"H100 NVL", 60.0, 417.5, 835.5},
    {"H100", 66.9, 494.7, 989.4},  // SXM5
    {"H200", 66.9, 494.7, 989.4},
    {"A100", 19.5, 156.0, 312.0},
    {"L40S", 91.6, 183.0, 362.1},
    {"L4", 30.3, 60.0, 121.0},
}};

}  // namespace

std::optional<double> known_peak_tflops(std::string_view device_name, GemmMath math) {
  for (const DevicePeak& peak : peaks)
    if (device_name.find(peak.name) != std::string_view::npos)
      return math == GemmMath::fp32 ? peak.fp32 : math == GemmMath::tf32 ? peak.tf32 : peak.half;
  return std::nullopt;
}

}  // namespace mlptrain
