// The few standard-library pieces the device code uses, for nvcc and for NVRTC (which ships no <stdint.h> or
// <type_traits>): fixed-width integers, integral_constant / true_type / false_type, conditional_t, is_same_v, and the
// CUtensorMap type a TMA kernel parameter needs (the driver's 128-byte opaque struct; TMA needs its address 64-byte
// aligned), and INFINITY / NAN.
#pragma once
#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;   // as CCCL's (arch_sm90.cuh includes CuTe): the two must agree

namespace std {
template <class T, T v> struct integral_constant {
  static constexpr T value = v;
  using value_type = T;
  constexpr operator T() const { return v; }
};
using true_type = integral_constant<bool, true>;
using false_type = integral_constant<bool, false>;
template <bool B, class T, class F> struct conditional { using type = T; };
template <class T, class F> struct conditional<false, T, F> { using type = F; };
template <bool B, class T, class F> using conditional_t = typename conditional<B, T, F>::type;
template <class A, class B> inline constexpr bool is_same_v = false;
template <class A> inline constexpr bool is_same_v<A, A> = true;
template <class T> constexpr const T& min(const T& a, const T& b) { return b < a ? b : a; }
template <class T> constexpr const T& max(const T& a, const T& b) { return a < b ? b : a; }
}  // namespace std
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#else
#include <stdint.h>
#include <type_traits>
#include <cuda.h>
#endif
