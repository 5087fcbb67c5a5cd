package telegram

// inlineKeyboard is an inline keyboard as the Bot API takes it
// (reply_markup of sendMessage and editMessageReplyMarkup). It is our own
// type, not models.InlineKeyboardMarkup: the client library's button
// always encodes "copy_text":{"text":""} (a struct value that omitempty
// does not drop), which the Bot API may refuse (BUTTON_COPY_TEXT_INVALID);
// ours sends a button's text and callback data only.
type inlineKeyboard struct {
	InlineKeyboard [][]inlineButton `json:"inline_keyboard"`
}

// inlineButton is a callback button: its label and the data a tap sends.
type inlineButton struct {
	Text         string `json:"text"`
	CallbackData string `json:"callback_data"`
}
