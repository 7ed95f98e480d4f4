/* SPDX-License-Identifier: MIT */
/*
 * The version of the wire protocol (schema/allot.proto,
 * docs/protocol.md) that this tree speaks: every Envelope carries it,
 * and a coordinator answers any other version with Error VERSION. The
 * one definition both sides include, so that agent, coordinator,
 * simulator, fuzz targets and benchmarks cannot drift apart.
 */
#ifndef ALLOT_COMMON_PROTOCOL_H
#define ALLOT_COMMON_PROTOCOL_H

#define ALLOT__PROTOCOL_VERSION 1u

#endif
