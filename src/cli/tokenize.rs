//! `strata tokenize`: the token ids of a text.

use clap::Args;

use super::{load_tokenizer, ModelArgs};

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to tokenize
    pub text: String,
    /// Treat special-token text (like <|im_start|>) as plain text
    #[arg(long = "no-parse-special")]
    pub no_parse_special: bool,
    /// Print a JSON array of ids instead of one "id piece" line per token
    #[arg(long = "json")]
    pub json: bool,
}

pub fn main(a: TokenizeArgs) -> anyhow::Result<()> {
    let tok = &load_tokenizer(&a.model)?;
    let ids = tok.encode(&a.text, !a.no_parse_special);
    if a.json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        for id in ids {
            println!("{id:>6} {:?}", String::from_utf8_lossy(&tok.token_to_piece(id)));
        }
    }
    Ok(())
}
