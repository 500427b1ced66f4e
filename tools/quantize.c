/* tools/quantize.c — troupe-quantize: writes a quantized checkpoint in the hub's layouts from a
 * plain (f32 / bf16 / f16) Hugging Face model directory, with no Python (tools/lib/quant_write.h).
 *
 *   troupe-quantize SRC DST --format F [--weight-only] [--dequantized]
 *
 * F: fp8 (compressed-tensors float-quantized, per channel), fp8-tensor (per tensor), fp8-block
 * (DeepSeek-V3's 128 x 128 blocks), int8 (int-quantized, per channel), int4 (pack-quantized, group
 * 128), nvfp4 (nvfp4-pack-quantized). fp8 and int8 quantize activations per token at run time
 * unless --weight-only. --dequantized writes the same weights decoded to f32 and no
 * quantization_config: the reference a weight-only checkpoint must match bit for bit. */
#include <stdio.h>
#include <string.h>

#include "engine/quant.h"
#include "tools/lib/quant_write.h"

static int s_usage(void)
{
    fprintf(stderr, "usage: troupe-quantize SRC DST --format fp8|fp8-tensor|fp8-block|int8|int4|nvfp4 "
                    "[--weight-only] [--dequantized]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *src = NULL, *dst = NULL, *format = NULL;
    quant_write_opts_t o = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--format") && i + 1 < argc)
            format = argv[++i];
        else if (!strcmp(argv[i], "--weight-only"))
            o.weight_only = 1;
        else if (!strcmp(argv[i], "--dequantized"))
            o.dequantize = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return s_usage();
        else if (argv[i][0] == '-') {
            fprintf(stderr, "troupe-quantize: unknown option '%s'\n", argv[i]);
            return s_usage();
        } else if (!src)
            src = argv[i];
        else if (!dst)
            dst = argv[i];
        else
            return s_usage();
    }
    if (!src || !dst || !format)
        return s_usage();
    if (!strcmp(format, "fp8-tensor"))
        o.fmt = BK_Q_FP8, o.per_tensor = 1;
    else if (!strcmp(format, "fp8-block"))
        o.fmt = BK_Q_FP8, o.block = 1;
    else if ((o.fmt = quant_format_parse(format)) < 0) {
        fprintf(stderr, "troupe-quantize: --format '%s': expected fp8, fp8-tensor, fp8-block, int8, int4 or nvfp4\n",
                format);
        return 2;
    }
    char err[1024];
    if (quant_write(src, dst, &o, err, sizeof err) < 0) {
        fprintf(stderr, "troupe-quantize: %s\n", err);
        return 1;
    }
    printf("%s: %s%s checkpoint of %s\n", dst, format, o.dequantize ? " (dequantized f32)" : "", src);
    return 0;
}
