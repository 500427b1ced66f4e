/* engine/rope.c — RoPE inverse frequencies for every rope kind, as transformers computes them.
 *
 * transformers builds inv_freq in float32 tensors (modeling_rope_utils.py), so each step below
 * rounds to float like the tensor op it mirrors; the angle pos * inv_freq is then an f32 product
 * inside the rope kernel. */
#include <math.h>

#include "common/util.h"
#include "engine/model.h"

int rope_inv_freq(const model_config_t *cfg, float *inv_freq, char *err, size_t errlen)
{
    const int dim = cfg->head_dim, half = dim / 2;
    if (dim < 2 || dim % 2)
        return errf(err, errlen, "rope: head_dim %d must be even", dim);
    if (!(cfg->rope_theta > 0))
        return errf(err, errlen, "rope: rope_theta %g must be > 0", cfg->rope_theta);
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)dim;                 /* arange(0, dim, 2).float() / dim */
        float p = (float)pow(cfg->rope_theta, (double)e);      /* base ** e, a float32 tensor */
        inv_freq[i] = 1.0f / p;
    }
    if (cfg->rope_kind == ROPE_LINEAR) {
        if (!(cfg->rope_factor > 0))
            return errf(err, errlen, "rope: linear factor %g must be > 0", cfg->rope_factor);
        for (int i = 0; i < half; i++)
            inv_freq[i] = inv_freq[i] / (float)cfg->rope_factor;
    } else if (cfg->rope_kind == ROPE_LLAMA3) {
        const float factor = (float)cfg->rope_factor, lo = (float)cfg->rope_low_freq_factor,
                    hi = (float)cfg->rope_high_freq_factor, old = (float)cfg->rope_original_max_pos;
        if (!(factor > 0) || !(hi > lo) || !(old > 0))
            return errf(err, errlen, "rope: llama3 parameters factor %g low %g high %g original %d are inconsistent",
                        cfg->rope_factor, cfg->rope_low_freq_factor, cfg->rope_high_freq_factor,
                        cfg->rope_original_max_pos);
        /* Python floats compared with a float32 tensor: compared as float32. */
        const float low_wavelen = (float)((double)cfg->rope_original_max_pos / cfg->rope_low_freq_factor);
        const float high_wavelen = (float)((double)cfg->rope_original_max_pos / cfg->rope_high_freq_factor);
        for (int i = 0; i < half; i++) {
            float f = inv_freq[i];
            float wavelen = (float)(2 * M_PI) / f;
            float scaled = wavelen > low_wavelen ? f / factor : f;
            float smooth = (old / wavelen - lo) / (hi - lo);
            float smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
            int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            inv_freq[i] = medium ? smoothed : scaled;
        }
    }
    return 0;
}
